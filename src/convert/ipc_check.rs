//! Arrow IPC input checked before arrow-rs reads it. arrow-rs allocates each message body at
//! the size the message announces and asserts on some malformed offsets: a file claiming a
//! 1 TiB body aborts the process on the allocation, and a mutated one can panic. [`check`]
//! walks the framing (every message's metadata and body length, or the file footer's blocks)
//! against the real file length first; [`Contained`] turns a panic left inside the reader into
//! an error for that file.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;

use crate::error::Error;

const CONTINUATION: u32 = 0xFFFF_FFFF;

fn read_u32(file: &mut File) -> std::result::Result<Option<u32>, String> {
    let mut b = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match file.read(&mut b[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err("the file ends inside a message length".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(Some(u32::from_le_bytes(b)))
}

fn read_exact_at(file: &mut File, at: u64, n: u64, len: u64) -> std::result::Result<Vec<u8>, String> {
    if at.checked_add(n).is_none_or(|end| end > len) {
        return Err(format!("{n} bytes at {at} lie past the end of the {len}-byte file"));
    }
    file.seek(SeekFrom::Start(at)).map_err(|e| e.to_string())?;
    let mut b = vec![0u8; n as usize];
    file.read_exact(&mut b).map_err(|e| e.to_string())?;
    Ok(b)
}

/// The body length a message's metadata announces, checked to be >= 0.
fn body_length(meta: &[u8], at: u64) -> std::result::Result<u64, String> {
    let m = arrow_ipc::root_as_message(meta).map_err(|e| format!("message at {at}: bad metadata ({e})"))?;
    u64::try_from(m.bodyLength()).map_err(|_| format!("message at {at}: negative body length {}", m.bodyLength()))
}

/// The messages of a stream from `start`: each metadata and body inside the file.
fn check_stream(file: &mut File, start: u64, len: u64) -> std::result::Result<(), String> {
    let mut at = start;
    file.seek(SeekFrom::Start(at)).map_err(|e| e.to_string())?;
    loop {
        let Some(first) = read_u32(file)? else { return Ok(()) };
        let (meta_len, prefix) = if first == CONTINUATION {
            match read_u32(file)? {
                Some(n) => (n, 8),
                None => return Err(format!("the file ends after a continuation marker at {at}")),
            }
        } else {
            (first, 4)
        };
        if meta_len == 0 {
            return Ok(()); // end of stream
        }
        let meta_len = i32::try_from(meta_len).map_err(|_| format!("message at {at}: negative metadata length"))? as u64;
        let meta = read_exact_at(file, at + prefix, meta_len, len).map_err(|e| format!("message at {at}: metadata: {e}"))?;
        let body = body_length(&meta, at)?;
        let body_at = at + prefix + meta_len;
        if body_at.checked_add(body).is_none_or(|end| end > len) {
            return Err(format!("message at {at} announces a {body}-byte body; the file has {} bytes left", len.saturating_sub(body_at)));
        }
        at = body_at + body;
        file.seek(SeekFrom::Start(at)).map_err(|e| e.to_string())?;
    }
}

/// The footer of an IPC file and every block it lists.
fn check_file(file: &mut File, len: u64) -> std::result::Result<(), String> {
    if len < 8 + 10 {
        return Err(format!("{len} bytes cannot hold an IPC file's magic and footer"));
    }
    let tail = read_exact_at(file, len - 10, 10, len)?;
    if &tail[4..] != b"ARROW1" {
        return Err("no closing ARROW1 magic".into());
    }
    let footer_len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if footer_len > len - 10 - 8 {
        return Err(format!("a {footer_len}-byte footer does not fit in the file"));
    }
    let footer_bytes = read_exact_at(file, len - 10 - footer_len, footer_len, len)?;
    let footer = arrow_ipc::root_as_footer(&footer_bytes).map_err(|e| format!("bad footer ({e})"))?;
    let blocks = footer.dictionaries().into_iter().flatten().chain(footer.recordBatches().into_iter().flatten());
    for b in blocks {
        let (Ok(offset), Ok(meta_len), Ok(body)) = (u64::try_from(b.offset()), u64::try_from(b.metaDataLength()), u64::try_from(b.bodyLength())) else {
            return Err(format!("a block with negative offset or length ({}, {}, {})", b.offset(), b.metaDataLength(), b.bodyLength()));
        };
        if offset.checked_add(meta_len).and_then(|e| e.checked_add(body)).is_none_or(|end| end > len) {
            return Err(format!("a block at {offset} of {meta_len} + {body} bytes lies past the end of the {len}-byte file"));
        }
        // The message inside the block must announce the block's body, not more.
        let meta = read_exact_at(file, offset, meta_len, len)?;
        let skip = if meta.get(..4) == Some(&CONTINUATION.to_le_bytes()[..]) { 8 } else { 4 };
        let inner = meta.get(skip..).ok_or_else(|| format!("block at {offset}: {meta_len} bytes hold no message"))?;
        let announced = body_length(inner, offset)?;
        if announced > body {
            return Err(format!("block at {offset}: its message announces a {announced}-byte body, the block holds {body}"));
        }
    }
    Ok(())
}

/// Check an IPC file (`is_file`: the ARROW1 file format) or stream of `len` bytes.
pub(super) fn check(file: &mut File, is_file: bool, len: u64) -> std::result::Result<(), String> {
    if is_file {
        // The file reader reads the footer's blocks only (not the stream inside).
        check_file(file, len)
    } else {
        check_stream(file, 0, len)
    }
}

fn panic_text(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| e.downcast_ref::<String>().cloned()).unwrap_or_else(|| "panic".into())
}

/// A panic inside arrow-rs while `what` the file at `path`, as an error.
pub(super) fn panic_error(path: &Path, what: &str, e: Box<dyn std::any::Any + Send>) -> Error {
    Error::corrupt(path, format!("malformed Arrow IPC (the reader failed {what} it: {})", panic_text(e.as_ref())))
}

/// An IPC reader whose panics end the iteration with an error instead of unwinding further.
pub(super) struct Contained<R> {
    inner: Option<R>,
    path: String,
}

impl<R> Contained<R> {
    pub(super) fn new(inner: R, path: &Path) -> Contained<R> {
        Contained { inner: Some(inner), path: path.display().to_string() }
    }
}

impl<R: Iterator<Item = std::result::Result<RecordBatch, ArrowError>>> Iterator for Contained<R> {
    type Item = std::result::Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let r = self.inner.as_mut()?;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.next())) {
            Ok(item) => item,
            Err(e) => {
                // The reader's state is unknown after a panic: no more batches from it.
                self.inner = None;
                Some(Err(ArrowError::IpcError(format!("{}: malformed Arrow IPC (the reader failed: {})", self.path, panic_text(e.as_ref())))))
            }
        }
    }
}
