//! [`NearDedup`]: near-duplicate detection with MinHash signatures and LSH bands.
//!
//! Signature of a text (the Python reference in the tests follows this word for word):
//! shingles are the overlapping `shingle`-char windows of the text (the whole text when it is
//! shorter; none when empty), or `shingle`-word windows in word mode (whitespace-separated,
//! joined by one space); each shingle hashes to `h = XXH3-64(utf8)`; permutation `i` maps it to
//! `(a_i * h + b_i) mod (2^61 - 1)` with `a_i = (splitmix64(seed, 2i) | 1) mod (2^61 - 1)` and
//! `b_i = splitmix64(seed, 2i + 1) mod (2^61 - 1)`, and the signature keeps each
//! permutation's minimum (`u64::MAX` for a text without shingles).
//!
//! LSH: the signature splits into `bands` bands of `rows` values. A text is a near duplicate
//! when some kept text shares a whole band with it *and* their signatures agree in at least
//! `threshold` of the positions (the MinHash estimate of their Jaccard similarity); otherwise
//! it is kept and indexed. Texts are checked in order, so the result is deterministic.
//!
//! Persistence ([`NearDedup::open_at`]): a folder holds `near.params` (the parameters, so a
//! folder is never reopened with other ones), `near.log` (the kept signatures, `num_perm`
//! little-endian u64 each, append-only) and `near.committed` (how many are committed, temp +
//! fsync + rename). [`NearDedup::commit_upto`] appends the signatures kept up to a count and
//! fsyncs; reopening replays the committed signatures into the index and cuts a longer log
//! back, so decisions after a crash are those the committed state makes.

use std::collections::HashMap;
use std::fs::File;
use std::hash::BuildHasherDefault;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::text::quality::IdHasher;
use crate::text::tensor::xxh3;

const MERSENNE61: u64 = (1 << 61) - 1;

pub use crate::rng::splitmix64;

/// What a shingle is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShingleUnit {
    /// Unicode chars.
    Chars,
    /// Whitespace-separated words.
    Words,
}

/// MinHash parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct MinHashParams {
    /// Permutations (signature length).
    pub num_perm: usize,
    /// Shingle size in `unit`s.
    pub shingle: usize,
    /// Chars or words.
    pub unit: ShingleUnit,
    /// Seed of the permutations.
    pub seed: u64,
    /// Jaccard threshold.
    pub threshold: f64,
    /// LSH bands (`num_perm / bands` rows each); `None` picks the bands that minimise false
    /// positives + false negatives around `threshold`.
    pub bands: Option<usize>,
}

impl Default for MinHashParams {
    fn default() -> MinHashParams {
        MinHashParams { num_perm: 128, shingle: 5, unit: ShingleUnit::Chars, seed: 1, threshold: 0.8, bands: None }
    }
}

/// Probability that two texts of Jaccard `s` share a band.
fn collide(s: f64, bands: usize, rows: usize) -> f64 {
    1.0 - (1.0 - s.powi(rows as i32)).powi(bands as i32)
}

/// The (bands, rows) minimising the false-positive + false-negative areas around `t`
/// (integrated with 100 midpoint steps each side).
pub fn optimal_bands(num_perm: usize, t: f64) -> (usize, usize) {
    let mut best = (1, num_perm, f64::INFINITY);
    for bands in 1..=num_perm {
        let rows = num_perm / bands;
        if rows == 0 {
            break;
        }
        let steps = 100;
        let fp: f64 = (0..steps).map(|k| collide(t * (k as f64 + 0.5) / steps as f64, bands, rows) * t / steps as f64).sum();
        let fneg: f64 = (0..steps).map(|k| (1.0 - collide(t + (1.0 - t) * (k as f64 + 0.5) / steps as f64, bands, rows)) * (1.0 - t) / steps as f64).sum();
        if fp + fneg < best.2 {
            best = (bands, rows, fp + fneg);
        }
    }
    (best.0, best.1)
}

/// A detector's MinHash signature function (permutations, shingles), detached from its index.
#[derive(Clone, Debug)]
pub struct Signer {
    num_perm: usize,
    shingle: usize,
    unit: ShingleUnit,
    a: Vec<u64>,
    b: Vec<u64>,
}

impl Signer {
    /// The signature of `text` (see the module docs).
    pub fn signature(&self, text: &str) -> Vec<u64> {
        let mut sig = vec![u64::MAX; self.num_perm];
        let mut add = |h: u64| {
            for (s, (&a, &b)) in sig.iter_mut().zip(self.a.iter().zip(&self.b)) {
                let v = ((a as u128 * h as u128 + b as u128) % MERSENNE61 as u128) as u64;
                if v < *s {
                    *s = v;
                }
            }
        };
        let k = self.shingle;
        match self.unit {
            ShingleUnit::Chars => {
                let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).chain(std::iter::once(text.len())).collect();
                let n = starts.len() - 1;
                if n > 0 && n <= k {
                    add(xxh3(text.as_bytes(), 0));
                } else if n > k {
                    for i in 0..=n - k {
                        add(xxh3(&text.as_bytes()[starts[i]..starts[i + k]], 0));
                    }
                }
            }
            ShingleUnit::Words => {
                let words: Vec<&str> = text.split_whitespace().collect();
                let n = words.len();
                let mut buf = String::new();
                let windows: Box<dyn Iterator<Item = &[&str]>> = if n == 0 {
                    Box::new(std::iter::empty())
                } else if n <= k {
                    Box::new(std::iter::once(&words[..]))
                } else {
                    Box::new(words.windows(k))
                };
                for w in windows {
                    buf.clear();
                    for (j, x) in w.iter().enumerate() {
                        if j > 0 {
                            buf.push(' ');
                        }
                        buf.push_str(x);
                    }
                    add(xxh3(buf.as_bytes(), 0));
                }
            }
        }
        sig
    }

}

/// MinHash signatures and an LSH index of the texts kept so far.
#[derive(Debug)]
pub struct NearDedup {
    params: MinHashParams,
    signer: Signer,
    bands: usize,
    rows: usize,
    /// Per band: band hash -> indices of kept texts.
    index: Vec<HashMap<u64, Vec<u32>, BuildHasherDefault<IdHasher>>>,
    /// Kept signatures, `num_perm` each.
    kept: Vec<u64>,
    /// Persistence: the folder, its open log and the committed count.
    store: Option<(PathBuf, File)>,
    committed: usize,
}

const NEAR_LOG: &str = "near.log";
const NEAR_COMMITTED: &str = "near.committed";
const NEAR_PARAMS: &str = "near.params";

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), source }
}

impl NearDedup {
    /// A detector with these parameters (checked: `num_perm` 1..=4096, `shingle` >= 1,
    /// `threshold` in (0, 1], `bands` dividing into at least one row).
    pub fn new(params: MinHashParams) -> Result<NearDedup> {
        if !(1..=4096).contains(&params.num_perm) {
            return Err(Error::invalid("num_perm", format!("{} (must be 1..=4096)", params.num_perm)));
        }
        if params.shingle == 0 {
            return Err(Error::invalid("shingle", "must be >= 1"));
        }
        if !(params.threshold > 0.0 && params.threshold <= 1.0) {
            return Err(Error::invalid("threshold", format!("{} (must be in (0, 1])", params.threshold)));
        }
        let (bands, rows) = match params.bands {
            Some(b) if b >= 1 && b <= params.num_perm => (b, params.num_perm / b),
            Some(b) => return Err(Error::invalid("bands", format!("{b} bands for {} permutations", params.num_perm))),
            None => optimal_bands(params.num_perm, params.threshold),
        };
        let a = (0..params.num_perm as u64).map(|i| (splitmix64(params.seed, 2 * i) | 1) % MERSENNE61).collect();
        let b = (0..params.num_perm as u64).map(|i| splitmix64(params.seed, 2 * i + 1) % MERSENNE61).collect();
        let signer = Signer { num_perm: params.num_perm, shingle: params.shingle, unit: params.unit, a, b };
        Ok(NearDedup { params, signer, bands, rows, index: (0..bands).map(|_| HashMap::default()).collect(), kept: Vec::new(), store: None, committed: 0 })
    }

    /// Open (or create) a persistent detector in `dir` at its last commit.
    pub fn open(dir: impl AsRef<Path>, params: MinHashParams) -> Result<NearDedup> {
        let dir = dir.as_ref();
        let committed = crate::text::dedup::read_count(&dir.join(NEAR_COMMITTED))?;
        NearDedup::open_at(dir, params, committed)
    }

    /// Open `dir` at exactly `committed` kept signatures (a count kept in the caller's own
    /// checkpoint): the committed signatures are indexed again, a longer log is cut back to
    /// them, a shorter one is an error; a folder made with other parameters is refused.
    pub fn open_at(dir: impl AsRef<Path>, params: MinHashParams, committed: u64) -> Result<NearDedup> {
        let mut d = NearDedup::new(params)?;
        let dir = dir.as_ref().to_path_buf();
        crate::io::create_dir_all(&dir)?;
        let desc = d.describe();
        let params_path = dir.join(NEAR_PARAMS);
        let old = crate::io::read_optional(&params_path, 4096)?.map(|b| String::from_utf8_lossy(&b).into_owned());
        match old {
            Some(old) if old.trim() == desc => {}
            Some(old) => return Err(Error::invalid("params", format!("{} was made with '{}', not '{desc}'", dir.display(), old.trim()))),
            None => {
                if committed > 0 {
                    return Err(Error::corrupt(&params_path, format!("missing, but the checkpoint names {committed} committed signatures")));
                }
                crate::text::dedup::write_atomic(&dir, NEAR_PARAMS, desc.as_bytes())?;
            }
        }
        let p = d.params.num_perm;
        let log_path = dir.join(NEAR_LOG);
        let log = crate::io::open_state(&log_path, false)?;
        let len = log.metadata().map_err(|e| io(&log_path, e))?.len();
        let want = committed.checked_mul(8 * p as u64).ok_or_else(|| Error::invalid("committed", format!("{committed} signatures")))?;
        if len < want {
            return Err(Error::corrupt(&log_path, format!("the checkpoint names {committed} committed signatures but the log holds {}", len / (8 * p as u64))));
        }
        if len > want {
            log.set_len(want).map_err(|e| io(&log_path, e))?;
            log.sync_all().map_err(|e| io(&log_path, e))?;
        }
        let mut reader = std::io::BufReader::with_capacity(1 << 20, &log);
        let mut buf = vec![0u8; 8 * p];
        let mut sig = vec![0u64; p];
        for _ in 0..committed {
            reader.read_exact(&mut buf).map_err(|e| io(&log_path, e))?;
            for (s, c) in sig.iter_mut().zip(buf.chunks_exact(8)) {
                *s = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            }
            d.index_signature(&sig);
        }
        drop(reader);
        d.committed = committed as usize;
        d.store = Some((dir, log));
        Ok(d)
    }

    /// The parameters as one line (stored with a persistent folder).
    fn describe(&self) -> String {
        let unit = match self.params.unit {
            ShingleUnit::Chars => "chars",
            ShingleUnit::Words => "words",
        };
        format!("num_perm={} shingle={} unit={unit} seed={} threshold={} bands={}", self.params.num_perm, self.params.shingle, self.params.seed, self.params.threshold, self.bands)
    }

    /// Kept signatures committed (the count a checkpoint stores).
    pub fn committed(&self) -> u64 {
        self.committed as u64
    }

    /// Record durably the signatures kept up to the moment `count` texts were kept (a
    /// [`NearDedup::len`] read earlier; later ones stay pending). In memory it only moves the
    /// committed count.
    pub fn commit_upto(&mut self, count: u64) -> Result<u64> {
        if count < self.committed as u64 || count > self.len() as u64 {
            return Err(Error::invalid("count", format!("{count} is outside the committed {} .. kept {}", self.committed, self.len())));
        }
        let p = self.params.num_perm;
        if let Some((dir, log)) = self.store.as_mut() {
            let log_path = dir.join(NEAR_LOG);
            let bytes: Vec<u8> = self.kept[self.committed * p..count as usize * p].iter().flat_map(|v| v.to_le_bytes()).collect();
            log.write_all(&bytes).map_err(|e| io(&log_path, e))?;
            log.sync_data().map_err(|e| io(&log_path, e))?;
            crate::text::dedup::write_atomic(dir, NEAR_COMMITTED, count.to_string().as_bytes())?;
        }
        self.committed = count as usize;
        Ok(count)
    }

    /// Record every kept signature durably; returns the committed count.
    pub fn commit(&mut self) -> Result<u64> {
        self.commit_upto(self.len() as u64)
    }

    /// (bands, rows per band).
    pub fn bands(&self) -> (usize, usize) {
        (self.bands, self.rows)
    }

    /// Texts kept (indexed) so far.
    pub fn len(&self) -> usize {
        self.kept.len() / self.params.num_perm
    }

    /// True when nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// The permutation parameters `(a, b)`.
    pub fn permutations(&self) -> (&[u64], &[u64]) {
        (&self.signer.a, &self.signer.b)
    }

    /// The signature of `text`.
    pub fn signature(&self, text: &str) -> Vec<u64> {
        self.signer.signature(text)
    }

    /// The signature function alone (a copy: usable on other threads while the detector is
    /// locked elsewhere).
    pub fn signer(&self) -> Arc<Signer> {
        Arc::new(self.signer.clone())
    }

    fn band_hash(&self, sig: &[u64], band: usize) -> u64 {
        let part = &sig[band * self.rows..(band + 1) * self.rows];
        let bytes: Vec<u8> = part.iter().flat_map(|v| v.to_le_bytes()).collect();
        xxh3(&bytes, band as u64)
    }

    /// Share of equal positions of two signatures (the Jaccard estimate).
    pub fn similarity(a: &[u64], b: &[u64]) -> f64 {
        a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len().max(1) as f64
    }

    /// For each text in order: true when it is not a near duplicate of a text kept before
    /// (it is then kept and indexed). Signatures are computed in parallel.
    pub fn insert(&mut self, texts: &[&str]) -> Vec<bool> {
        let sigs: Vec<Vec<u64>> = if texts.len() >= 64 { texts.par_iter().map(|t| self.signature(t)).collect() } else { texts.iter().map(|t| self.signature(t)).collect() };
        sigs.iter().map(|s| self.insert_signature(s)).collect()
    }

    /// Check and index one signature.
    pub fn insert_signature(&mut self, sig: &[u64]) -> bool {
        let p = self.params.num_perm;
        let hashes: Vec<u64> = (0..self.bands).map(|band| self.band_hash(sig, band)).collect();
        for (band, h) in hashes.iter().enumerate() {
            if let Some(cands) = self.index[band].get(h) {
                for &c in cands {
                    let other = &self.kept[c as usize * p..(c as usize + 1) * p];
                    if NearDedup::similarity(sig, other) >= self.params.threshold {
                        return false;
                    }
                }
            }
        }
        self.push_kept(sig, hashes);
        true
    }

    /// Index a signature known to be kept (replaying a log).
    fn index_signature(&mut self, sig: &[u64]) {
        let hashes: Vec<u64> = (0..self.bands).map(|band| self.band_hash(sig, band)).collect();
        self.push_kept(sig, hashes);
    }

    fn push_kept(&mut self, sig: &[u64], hashes: Vec<u64>) {
        let id = self.len() as u32;
        self.kept.extend_from_slice(sig);
        for (band, h) in hashes.into_iter().enumerate() {
            self.index[band].entry(h).or_default().push(id);
        }
    }
}
