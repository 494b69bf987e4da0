//! Strings as tensors, and text stages for pretraining pipelines.
//!
//! [`StringTensor`] holds a batch of UTF-8 strings in Arrow's `Utf8View` layout (16-byte views:
//! length, 4-byte prefix, inline up to 12 bytes, else buffer index + offset) and converts to and
//! from the exchange layout (offsets + one UTF-8 payload: int32 like Arrow `Utf8`, int64 like
//! `LargeUtf8`, or uint32). Its operations (prefix, equality and length filters, XXH3-64 hashes,
//! take / filter / concat) run in parallel over rows and never go through per-string objects.
//!
//! The text stages — [`Cleaner`], [`QualityFilter`], [`PiiMasker`] — each map one string to a
//! string (or drop it); [`TextPipeline`] runs any sequence of them in one fused pass per row,
//! reusing the input's views for rows a stage leaves unchanged. The same stages are DataFusion
//! scalar functions (`text_clean`, `text_quality`, `pii_mask`, `text_hash`), registered by
//! `query::register_zrecord_extension` (feature `sql`).
//!
//! ```
//! use zrecord::text::{Cleaner, PiiMasker, StringTensor, TextPipeline, Stage};
//!
//! let docs = StringTensor::from_strs(["  Mail me: ada@example.org\r\n", "v1.2.3.4 is out"]);
//! let pipe = TextPipeline::new(vec![Stage::Clean(Cleaner::default()), Stage::Pii(PiiMasker::default())]);
//! let out = pipe.run(&docs).unwrap();
//! assert_eq!(out.text.value(0), Some("Mail me: <EMAIL>"));
//! assert_eq!(out.text.value(1), Some("v1.2.3.4 is out")); // a version string, not an address
//! ```

mod clean;
mod dedup;
mod minhash;
mod pii;
mod pipeline;
mod quality;
mod tensor;
mod tokenize;

pub use clean::Cleaner;
pub use dedup::ExactDedup;
pub use minhash::{optimal_bands, splitmix64, MinHashParams, NearDedup, ShingleUnit, Signer};
pub use pii::{PiiKind, PiiMasker};
pub use pipeline::{Stage, StageOutput, TextPipeline};
pub use quality::{QualityFilter, QualityRules, QualityStats};
pub use tensor::{LengthUnit, OffsetType, StringTensor};
pub use tokenize::Tokenizer;
