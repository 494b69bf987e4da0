//! [`Tokenizer`]: Hugging Face `tokenizer.json` tokenizers (the `tokenizers` crate), batch
//! encoding in parallel into a ragged int32 batch or a padded batch with an attention mask.

use std::path::Path;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{Allocator, RaggedBatch, RaggedInput, Tensor};
use crate::text::StringTensor;

/// A tokenizer loaded from a `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    add_special_tokens: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer(vocab={}, add_special_tokens={})", self.vocab_size(), self.add_special_tokens)
    }
}

fn tk_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::invalid("tokenizer", format!("{what}: {e}"))
}

/// Largest `tokenizer.json` read (the largest published ones are tens of MiB).
pub const MAX_TOKENIZER_BYTES: u64 = 1 << 30;

impl Tokenizer {
    /// Load `tokenizer.json` from a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let bytes = crate::io::read_bounded(path, MAX_TOKENIZER_BYTES)?;
        let text = String::from_utf8(bytes).map_err(|_| Error::invalid("tokenizer", format!("'{}' is not UTF-8", path.display())))?;
        Tokenizer::from_json(&text).map_err(|e| Error::invalid("tokenizer", format!("'{}': {e}", path.display())))
    }

    /// Parse a `tokenizer.json` document.
    pub fn from_json(json: &str) -> Result<Tokenizer> {
        let inner: tokenizers::Tokenizer = json.parse().map_err(|e| tk_err("not a tokenizer.json", e))?;
        Ok(Tokenizer { inner, add_special_tokens: true })
    }

    /// Whether the post-processor's special tokens ([CLS], <s>, ...) are added (default true).
    pub fn with_special_tokens(mut self, on: bool) -> Tokenizer {
        self.add_special_tokens = on;
        self
    }

    /// Vocabulary size (with added tokens).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of every string (nulls encode as empty), in parallel.
    pub fn encode_ids(&self, texts: &StringTensor) -> Result<Vec<Vec<u32>>> {
        let inputs: Vec<&str> = (0..texts.len()).map(|i| texts.value(i).unwrap_or("")).collect();
        let encs = self.inner.encode_batch_fast(inputs, self.add_special_tokens).map_err(|e| tk_err("encoding failed", e))?;
        Ok(encs.into_iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// Encode into a ragged int32 batch (one ndim-1 record per string), ready for a
    /// `RaggedWriter` or the loader.
    pub fn encode(&self, texts: &StringTensor, allocator: &Allocator) -> Result<RaggedBatch> {
        let ids = self.encode_ids(texts)?;
        let total: usize = ids.iter().map(Vec::len).sum();
        if total > i32::MAX as usize {
            return Err(Error::TooManyValues { count: total as u64, limit: i32::MAX as u64 });
        }
        let mut values: Vec<i32> = Vec::with_capacity(total);
        let mut cu = Vec::with_capacity(ids.len() + 1);
        let mut shapes = Vec::with_capacity(ids.len());
        cu.push(0i32);
        for r in &ids {
            for &t in r {
                values.push(i32::try_from(t).map_err(|_| Error::invalid("tokenizer", format!("token id {t} does not fit int32")))?);
            }
            cu.push(values.len() as i32);
            shapes.push(r.len() as u64);
        }
        RaggedBatch::copy_from_input(allocator, &RaggedInput::from_slices(&values[..], &cu[..], &shapes[..], 1))
    }

    /// Encode into `[n, length]` int32 ids padded with `pad_id` and a `[n, length]` bool
    /// attention mask; `length` is the longest encoding, capped at `max_length` (longer
    /// encodings are truncated).
    pub fn encode_padded(&self, texts: &StringTensor, max_length: Option<usize>, pad_id: i32, allocator: &Allocator) -> Result<(Tensor, Tensor)> {
        let ids = self.encode_ids(texts)?;
        let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
        let len = max_length.map_or(longest, |m| m.min(longest));
        let n = ids.len();
        let cells = n.checked_mul(len).ok_or_else(|| Error::invalid("max_length", format!("{n} x {len} tokens")))?;
        let mut out = vec![pad_id; cells];
        let mut mask = vec![0u8; cells];
        for (row, r) in ids.iter().enumerate() {
            for (j, &t) in r.iter().take(len).enumerate() {
                out[row * len + j] = i32::try_from(t).map_err(|_| Error::invalid("tokenizer", format!("token id {t} does not fit int32")))?;
                mask[row * len + j] = 1;
            }
        }
        let ids = Tensor::from_slice(allocator, &out, &[n, len])?;
        let mask = Tensor::from_slice(allocator, &mask, &[n, len])?.reinterpret(DType::Bool, vec![n, len])?;
        Ok((ids, mask))
    }
}
