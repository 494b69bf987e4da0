//! Record codecs: `raw`, `zstd` (one frame per record) and `zstd_dict` (one frame per record
//! against a shared trained dictionary), plus dictionary training.

use std::fmt;
use std::mem::MaybeUninit;
use std::path::Path;
use std::str::FromStr;
use std::sync::Mutex;

use zstd::zstd_safe::{self, CCtx, DCtx, DDict, WriteBuf};

use crate::error::{Error, Result};

/// Default zstd level.
pub const DEFAULT_LEVEL: i32 = 3;
/// How many times its stored size a zstd frame can at most decode to: a block decodes to at
/// most 128 KiB and takes at least 4 bytes (an RLE block), so stored bytes x 32768 bounds the
/// decoded size of any zstd data (dictionary or not). Used to refuse, at open, stores whose
/// files could not produce the records they claim.
pub const MAX_ZSTD_EXPANSION: u64 = 1 << 15;

/// How records are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Stored as is.
    Raw,
    /// One zstd frame per record.
    Zstd,
    /// One zstd frame per record against a shared dictionary.
    ZstdDict,
}

impl Codec {
    /// `"raw"`, `"zstd"` or `"zstd_dict"`.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::ZstdDict => "zstd_dict",
        }
    }

    /// All codecs.
    pub const ALL: [Codec; 3] = [Codec::Raw, Codec::Zstd, Codec::ZstdDict];
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Codec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Codec> {
        match s {
            "raw" => Ok(Codec::Raw),
            "zstd" => Ok(Codec::Zstd),
            "zstd_dict" => Ok(Codec::ZstdDict),
            other => Err(Error::InvalidCodec { reason: format!("unknown codec '{other}'; use raw, zstd or zstd_dict") }),
        }
    }
}

fn zerr(path: &Path, what: &str, code: usize) -> Error {
    Error::Codec { path: path.to_path_buf(), reason: format!("{what}: {}", zstd_safe::get_error_name(code)) }
}

/// Per-worker encoder state. A `zstd_dict` encoder loads the dictionary into its context
/// once (sticky), so each record is compressed with parameters sized for that record.
pub(crate) struct Encoder {
    codec: Codec,
    level: i32,
    cctx: Option<CCtx<'static>>,
    scratch: Vec<u8>,
}

impl Encoder {
    /// A new encoder; errors when zstd rejects the level or the dictionary.
    pub(crate) fn new(codec: Codec, level: i32, dictionary: Option<&[u8]>) -> Result<Encoder> {
        let cctx = match codec {
            Codec::Raw => None,
            Codec::Zstd => Some(CCtx::create()),
            Codec::ZstdDict => {
                let mut c = CCtx::create();
                let bad = |what: &str, code: usize| Error::InvalidCodec { reason: format!("{what}: {}", zstd_safe::get_error_name(code)) };
                c.set_parameter(zstd_safe::CParameter::CompressionLevel(level)).map_err(|e| bad("level", e))?;
                let d = dictionary.ok_or_else(|| Error::InvalidCodec { reason: "zstd_dict needs a dictionary".into() })?;
                c.load_dictionary(d).map_err(|e| bad("zstd could not load the dictionary", e))?;
                Some(c)
            }
        };
        Ok(Encoder { codec, level, cctx, scratch: Vec::new() })
    }

    /// Encode `src`; returns the stored bytes (borrowing `src` for raw, the scratch otherwise).
    pub(crate) fn encode<'a>(&'a mut self, src: &'a [u8], path: &Path) -> Result<&'a [u8]> {
        let Some(cctx) = self.cctx.as_mut() else { return Ok(src) };
        let bound = zstd_safe::compress_bound(src.len());
        self.scratch.clear();
        self.scratch.reserve(bound);
        let r = match self.codec {
            Codec::ZstdDict => cctx.compress2(&mut self.scratch, src),
            _ => cctx.compress(&mut self.scratch, src, self.level),
        };
        r.map_err(|c| zerr(path, "compress", c))?;
        Ok(&self.scratch)
    }
}

/// An output slot of possibly uninitialised memory for zstd to decode into.
struct Slot<'a> {
    buf: &'a mut [MaybeUninit<u8>],
    filled: usize,
}

// SAFETY: `as_slice` exposes only the `filled` prefix that zstd reported written;
// `capacity` and `as_mut_ptr` describe exactly `buf`.
unsafe impl WriteBuf for Slot<'_> {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `filled` bytes were initialised by zstd (see `filled_until`).
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast(), self.filled) }
    }
    fn capacity(&self) -> usize {
        self.buf.len()
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr().cast()
    }
    unsafe fn filled_until(&mut self, n: usize) {
        self.filled = n;
    }
}

/// Shared decoding state of one store: the digested dictionary and a pool of contexts.
pub(crate) struct Decoder {
    codec: Codec,
    ddict: Option<DDict<'static>>,
    pool: Mutex<Vec<DCtx<'static>>>,
}

impl Decoder {
    pub(crate) fn new(codec: Codec, dictionary: Option<&[u8]>, path: &Path) -> Result<Decoder> {
        let ddict = match (codec, dictionary) {
            (Codec::ZstdDict, Some(d)) => Some(
                DDict::try_create(d).ok_or_else(|| Error::corrupt(path, "zstd could not load the dictionary"))?,
            ),
            (Codec::ZstdDict, None) => return Err(Error::corrupt(path, "zstd_dict store without dictionary")),
            _ => None,
        };
        Ok(Decoder { codec, ddict, pool: Mutex::new(Vec::new()) })
    }

    /// Borrow a decompression context for a run of records.
    pub(crate) fn context(&self) -> DecodeContext<'_> {
        let dctx = if self.codec == Codec::Raw {
            None
        } else {
            let pooled = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
            Some(pooled.unwrap_or_else(DCtx::create))
        };
        DecodeContext { decoder: self, dctx, scratch: Vec::new() }
    }
}

/// A decompression context on loan from a [`Decoder`]; returned on drop.
pub(crate) struct DecodeContext<'a> {
    decoder: &'a Decoder,
    dctx: Option<DCtx<'static>>,
    /// Stored bytes read from a byte source without a mapping (reused across records).
    pub(crate) scratch: Vec<u8>,
}

impl DecodeContext<'_> {
    /// Decode `src` into exactly `out` (whose length is the record's decoded size).
    pub(crate) fn decode_into(&mut self, src: &[u8], out: &mut [MaybeUninit<u8>], file: &Path) -> Result<()> {
        match self.dctx.as_mut() {
            None => {
                if src.len() != out.len() {
                    return Err(Error::corrupt(file, format!("raw record is {} bytes, expected {}", src.len(), out.len())));
                }
                // SAFETY: `src` and `out` have equal lengths and do not overlap (`src` is
                // in a read-only mapping, `out` in an exclusive allocation).
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.as_mut_ptr().cast::<u8>(), src.len()) };
                Ok(())
            }
            Some(dctx) => {
                let want = out.len();
                let mut slot = Slot { buf: out, filled: 0 };
                let r = match self.decoder.ddict.as_ref() {
                    Some(d) => dctx.decompress_using_ddict(&mut slot, src, d),
                    None => dctx.decompress(&mut slot, src),
                };
                let n = r.map_err(|c| zerr(file, "decompress", c))?;
                if n != want {
                    return Err(Error::corrupt(file, format!("record decodes to {n} bytes, expected {want}")));
                }
                Ok(())
            }
        }
    }
}

impl Drop for DecodeContext<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.dctx.take() {
            self.decoder.pool.lock().unwrap_or_else(|p| p.into_inner()).push(d);
        }
    }
}

/// Sample records gathered for dictionary training: copied once into one continuous buffer
/// (what zstd's trainer takes), each capped at its first 128 KiB (a dictionary only helps the
/// start of a frame), up to a total budget.
#[derive(Debug)]
pub struct DictSamples {
    data: Vec<u8>,
    sizes: Vec<usize>,
    budget: usize,
}

impl DictSamples {
    /// At most this many bytes of one sample are kept.
    pub const SAMPLE_CAP: usize = 128 << 10;
    /// Default total budget.
    pub const TOTAL_CAP: usize = 256 << 20;

    /// An empty set holding at most `budget` bytes.
    pub fn new(budget: usize) -> DictSamples {
        DictSamples { data: Vec::new(), sizes: Vec::new(), budget }
    }

    /// Add one sample (empty ones are skipped); false once the budget is spent.
    pub fn push(&mut self, sample: &[u8]) -> bool {
        let s = &sample[..sample.len().min(Self::SAMPLE_CAP)];
        if self.data.len() + s.len() > self.budget {
            return false;
        }
        if !s.is_empty() {
            self.data.extend_from_slice(s);
            self.sizes.push(s.len());
        }
        true
    }

    /// Train a dictionary of at most `max_size` bytes. Too few samples is an `InvalidCodec`
    /// error.
    pub fn train(&self, max_size: usize) -> Result<Vec<u8>> {
        if max_size < 256 {
            return Err(Error::invalid("max_size", format!("{max_size} bytes; a dictionary needs at least 256")));
        }
        if self.sizes.len() < 8 {
            return Err(Error::InvalidCodec { reason: format!("dictionary training needs at least 8 nonempty samples, got {}", self.sizes.len()) });
        }
        zstd::dict::from_continuous(&self.data, &self.sizes, max_size).map_err(|e| Error::InvalidCodec {
            reason: format!("dictionary training failed: {e} ({} samples, {} bytes)", self.sizes.len(), self.data.len()),
        })
    }
}

/// Train a zstd dictionary of at most `max_size` bytes from sample records (see
/// [`DictSamples`]: 128 KiB per sample, 256 MiB in all).
pub fn train_dict_from_samples<'a>(samples: impl IntoIterator<Item = &'a [u8]>, max_size: usize) -> Result<Vec<u8>> {
    let mut set = DictSamples::new(DictSamples::TOTAL_CAP);
    for s in samples {
        if !set.push(s) {
            break;
        }
    }
    set.train(max_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_names() {
        for c in Codec::ALL {
            assert_eq!(c.name().parse::<Codec>().unwrap(), c);
        }
        assert!(matches!("lz4".parse::<Codec>(), Err(Error::InvalidCodec { .. })));
    }

    #[test]
    fn encode_decode_into_uninit() {
        let p = Path::new("x");
        let src: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let samples: Vec<Vec<u8>> = (0..64).map(|k| src[k * 100..k * 100 + 1000].to_vec()).collect();
        let dict = train_dict_from_samples(samples.iter().map(|s| s.as_slice()), 4096).unwrap();
        for codec in Codec::ALL {
            let mut enc = Encoder::new(codec, 3, (codec == Codec::ZstdDict).then_some(&dict[..])).unwrap();
            let stored = enc.encode(&src, p).unwrap().to_vec();
            let dec = Decoder::new(codec, (codec == Codec::ZstdDict).then_some(&dict[..]), p).unwrap();
            let mut out = vec![MaybeUninit::<u8>::uninit(); src.len()];
            dec.context().decode_into(&stored, &mut out, p).unwrap();
            // SAFETY: decode_into succeeded, so every byte was written.
            let out: Vec<u8> = out.iter().map(|b| unsafe { b.assume_init() }).collect();
            assert_eq!(out, src, "{codec}");
            // Wrong output size is an error, not a partial record.
            let mut short = vec![MaybeUninit::<u8>::uninit(); src.len() - 1];
            assert!(dec.context().decode_into(&stored, &mut short, p).is_err());
            if codec != Codec::Raw {
                let mut bad = stored.clone();
                let mid = bad.len() / 2;
                bad.truncate(mid);
                let mut o = vec![MaybeUninit::<u8>::uninit(); src.len()];
                assert!(dec.context().decode_into(&bad, &mut o, p).is_err());
            }
        }
    }

    #[test]
    fn training_errors() {
        assert!(train_dict_from_samples([&b"abc"[..]], 4096).is_err());
        let s = [1u8; 100];
        assert!(train_dict_from_samples((0..20).map(|_| &s[..]), 10).is_err());
    }
}
