//! Sequence packing: ragged token records (documents) packed into fixed `[rows, seq_len]`
//! windows for pretraining, with the flash-attention varlen layout.
//!
//! Documents come in the order of the stream (the epoch order of `mode`, this rank's share of
//! it) into a window of at most `lookahead` documents. Each step places the window's documents
//! in order, each into the first row with room for all of it (first fit); a document that fits
//! nowhere stays in the window, in order, for the next step (where it is first to choose).
//! A document longer than `seq_len` is cut as it is placed: each `seq_len` piece takes a whole
//! empty row, the last piece is placed like any document, and what does not fit this step stays
//! at its place in the window: nothing is dropped (empty documents hold no tokens and are
//! skipped). Per step the output is the tokens (the source's integer dtype, padding
//! `pad_id`), `position_ids` (each token's offset in its document: restarting at every
//! document, continuing across the pieces of a cut one), `document_ids` (-1 on padding), and
//! `cu_seqlens` (int32 boundaries of every segment, padding runs included, over the rows laid
//! end to end, so its last value is `rows * seq_len`).
//!
//! The state after a step is the stream cursor and the window's (document, offset) pairs: a
//! checkpoint that resumes exactly without replaying (the window's documents are read again).
//! Each step reads the documents it adds to the window in one gather.

use std::collections::VecDeque;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::loader::mixture::Mixture;
use crate::loader::sampler::{Mode, Sampler};
use crate::memory::{Allocator, Tensor};
use crate::store::{Batch, Ids, Layout, SourceView};

/// The largest `rows * seq_len` of one packed batch (2^28 tokens).
pub const MAX_PACKED_TOKENS: usize = 1 << 28;
/// The largest lookahead window (documents held between steps).
pub const MAX_LOOKAHEAD: usize = 1 << 16;

/// Packing options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackOptions {
    /// Rows per batch.
    pub rows: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// Documents the window holds (first fit looks this far ahead).
    pub lookahead: usize,
    /// The padding token.
    pub pad_id: i64,
}

/// The resumable state of a packer: documents pulled from this rank's stream and the window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackState {
    /// Steps produced.
    pub step: u64,
    /// Documents pulled from this rank's stream.
    pub cursor: u64,
    /// The window: (document id, tokens of it already placed), in order.
    pub window: Vec<(u64, u64)>,
}

/// One packed batch.
#[derive(Debug)]
pub struct Packed {
    /// `[rows, seq_len]` tokens in the source's dtype.
    pub tokens: Tensor,
    /// `rows * seq_len` offsets of each token in its document (0 on padding).
    pub position_ids: Vec<i64>,
    /// `rows * seq_len` document ids (-1 on padding).
    pub document_ids: Vec<i64>,
    /// Segment boundaries over the rows laid end to end (padding runs are segments).
    pub cu_seqlens: Vec<i32>,
    /// Tokens that are not padding.
    pub real_tokens: u64,
}

#[derive(Debug)]
struct Pending {
    doc: u64,
    offset: u64,
    /// The gathered values holding the document (shared by the documents of one gather: no
    /// per-document copy) and the document's byte range in them.
    values: Tensor,
    range: std::ops::Range<usize>,
}

impl Pending {
    /// The document's tokens as bytes (all of them; `offset` of them placed).
    fn bytes(&self) -> &[u8] {
        &self.values.as_bytes()[self.range.clone()]
    }
}

/// Where documents come from: one source's epoch order, or a mixture's record slots.
#[derive(Clone, Debug)]
enum DocOrder {
    Sampler(Sampler),
    Mixture(Box<Mixture>),
}

/// Packs a ragged token source into fixed windows (see the module documentation).
#[derive(Debug)]
pub struct Packer {
    view: SourceView,
    order: DocOrder,
    n: u64,
    rank: u64,
    world_size: u64,
    options: PackOptions,
    itemsize: usize,
    pad: Vec<u8>,
    allocator: Allocator,
    cursor: u64,
    step: u64,
    window: VecDeque<Pending>,
}

fn pad_bytes(dtype: DType, pad_id: i64) -> Result<Vec<u8>> {
    let (lo, hi): (i128, i128) = match dtype {
        DType::Int8 => (i8::MIN as i128, i8::MAX as i128),
        DType::Int16 => (i16::MIN as i128, i16::MAX as i128),
        DType::Int32 => (i32::MIN as i128, i32::MAX as i128),
        DType::Int64 => (i64::MIN as i128, i64::MAX as i128),
        DType::UInt8 => (0, u8::MAX as i128),
        DType::UInt16 => (0, u16::MAX as i128),
        DType::UInt32 => (0, u32::MAX as i128),
        DType::UInt64 => (0, u64::MAX as i128),
        other => return Err(Error::invalid("tokens", format!("packing needs integer tokens, the source holds {other}"))),
    };
    if (pad_id as i128) < lo || (pad_id as i128) > hi {
        return Err(Error::invalid("pad_id", format!("{pad_id} does not fit {dtype}")));
    }
    Ok(pad_id.to_le_bytes()[..dtype.size()].to_vec())
}

impl Packer {
    /// A packer over `view` (ragged, ndim 1, integer tokens): this rank's documents are stream
    /// positions `rank, rank + world_size, ...` of the epoch order of `mode` keyed by `seed`.
    pub fn new(view: SourceView, mode: Mode, seed: u64, rank: u64, world_size: u64, options: PackOptions) -> Result<Packer> {
        let src = view.source().clone();
        if src.layout() != (Layout::Ragged { ndim: 1 }) {
            return Err(Error::invalid("source", format!("packing reads ragged ndim-1 token records; '{}' is {}", src.name(), src.layout())));
        }
        let pad = pad_bytes(src.dtype(), options.pad_id)?;
        if options.rows == 0 || options.seq_len == 0 {
            return Err(Error::invalid("rows", format!("rows ({}) and seq_len ({}) must be at least 1", options.rows, options.seq_len)));
        }
        if options.rows.checked_mul(options.seq_len).is_none_or(|t| t > MAX_PACKED_TOKENS) || options.seq_len > i32::MAX as usize {
            return Err(Error::invalid("seq_len", format!("{} rows of {} tokens exceed the {MAX_PACKED_TOKENS} tokens of a packed batch", options.rows, options.seq_len)));
        }
        if options.lookahead == 0 || options.lookahead > MAX_LOOKAHEAD {
            return Err(Error::invalid("lookahead", format!("{} is not in 1..={MAX_LOOKAHEAD}", options.lookahead)));
        }
        if world_size == 0 || rank >= world_size {
            return Err(Error::invalid("rank", format!("rank {rank} is not in 0..{world_size}")));
        }
        let n = src.len();
        let order = DocOrder::Sampler(Sampler::new(n, 1, mode, seed)?);
        let itemsize = src.dtype().size();
        let allocator = view.allocator().clone();
        Ok(Packer { view, order, n, rank, world_size, options, itemsize, pad, allocator, cursor: 0, step: 0, window: VecDeque::new() })
    }

    /// A packer whose documents are `mixture`'s records, one slot after another (this rank's
    /// slots `rank, rank + world_size, ...`): several datasets mixed in set proportions, then
    /// packed. `view` reads the mixture's id space (the sources' token views concatenated).
    pub fn with_mixture(view: SourceView, mixture: Mixture, rank: u64, world_size: u64, options: PackOptions) -> Result<Packer> {
        if mixture.len() != view.len() {
            return Err(Error::invalid("mixture", format!("the mixture's sources hold {} records, the token view {}", mixture.len(), view.len())));
        }
        let mut p = Packer::new(view, Mode::Sequential, 0, rank, world_size, options)?;
        p.order = DocOrder::Mixture(Box::new(mixture));
        Ok(p)
    }

    /// The allocator the batches come from (the view's).
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// The options.
    pub fn options(&self) -> PackOptions {
        self.options
    }

    /// This rank's stream position `j` as a document id.
    fn doc_at(&self, j: u64) -> Result<u64> {
        let pos = j as u128 * self.world_size as u128 + self.rank as u128;
        match &self.order {
            DocOrder::Sampler(s) => Ok(s.batch(pos as u64)[0]),
            DocOrder::Mixture(m) => m.slot_id(pos),
        }
    }

    /// The epoch of the document stream (this rank's next document); for a mixture, the
    /// lowest epoch of its sources.
    pub fn epoch(&self) -> u64 {
        let pos = self.cursor.saturating_mul(self.world_size).saturating_add(self.rank);
        match &self.order {
            DocOrder::Sampler(_) => pos / self.n,
            DocOrder::Mixture(m) => {
                let b = m.batch_size() as u64;
                m.epochs(pos / b).into_iter().min().unwrap_or(0)
            }
        }
    }

    /// The state after the last step.
    pub fn state(&self) -> PackState {
        PackState { step: self.step, cursor: self.cursor, window: self.window.iter().map(|p| (p.doc, p.offset)).collect() }
    }

    /// Gather `docs` (one read) as pending documents placed up to `offsets`.
    fn read(&self, docs: &[u64], offsets: &[u64]) -> Result<Vec<Pending>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        let Batch::Ragged(b) = self.view.gather_ids(Ids::List(docs))? else {
            return Err(Error::invalid("source", "a ragged source returned a dense batch"));
        };
        let cu = b.cu_seqlens_slice();
        let values = b.values();
        let nbytes = values.as_bytes().len();
        let mut out = Vec::with_capacity(docs.len());
        for (k, (&doc, &offset)) in docs.iter().zip(offsets).enumerate() {
            let (a, z) = (cu[k] as usize * self.itemsize, cu[k + 1] as usize * self.itemsize);
            if a > z || z > nbytes {
                return Err(Error::invalid("source", format!("document {doc}: offsets outside its batch")));
            }
            if offset > ((z - a) / self.itemsize) as u64 {
                return Err(Error::invalid("state", format!("document {doc} has {} tokens, the state says {offset} were placed", (z - a) / self.itemsize)));
            }
            out.push(Pending { doc, offset, values: values.clone(), range: a..z });
        }
        Ok(out)
    }

    /// Resume from `state` (checked: a state is untrusted input).
    pub fn restore(&mut self, state: &PackState) -> Result<()> {
        if state.window.len() > self.options.lookahead {
            return Err(Error::invalid("state", format!("a window of {} documents exceeds the lookahead of {}", state.window.len(), self.options.lookahead)));
        }
        if let Some(&(d, _)) = state.window.iter().find(|(d, _)| *d >= self.n) {
            return Err(Error::invalid("state", format!("document {d} is outside the {} of the source", self.n)));
        }
        let docs: Vec<u64> = state.window.iter().map(|&(d, _)| d).collect();
        let offsets: Vec<u64> = state.window.iter().map(|&(_, o)| o).collect();
        let window = self.read(&docs, &offsets)?;
        self.window = window.into();
        self.cursor = state.cursor;
        self.step = state.step;
        Ok(())
    }

    /// Pack the next batch.
    pub fn next_batch(&mut self) -> Result<Packed> {
        let PackOptions { rows, seq_len, lookahead, .. } = self.options;
        let is = self.itemsize;
        // Top the window up to `lookahead` documents: one gather.
        let need = lookahead - self.window.len().min(lookahead);
        let docs: Vec<u64> = (0..need as u64).map(|k| self.doc_at(self.cursor + k)).collect::<Result<_>>()?;
        let fresh = self.read(&docs, &vec![0; docs.len()])?;
        let window: Vec<Pending> = self.window.drain(..).chain(fresh).collect();

        // Place the window's documents in order: first fit, long ones cut into whole rows.
        let mut offsets: Vec<u64> = window.iter().map(|p| p.offset).collect();
        let mut used = vec![0usize; rows];
        let mut segments: Vec<Vec<(usize, u64, usize)>> = vec![Vec::new(); rows];
        for (w, p) in window.iter().enumerate() {
            let total = (p.range.len() / is) as u64;
            while offsets[w] < total {
                let rem = (total - offsets[w]) as usize;
                let row = if rem <= seq_len { (0..rows).find(|&r| seq_len - used[r] >= rem) } else { (0..rows).find(|&r| used[r] == 0) };
                let Some(r) = row else { break };
                let len = rem.min(seq_len);
                segments[r].push((w, offsets[w], len));
                used[r] += len;
                offsets[w] += len as u64;
            }
        }

        // Lay the rows out.
        let cells = rows * seq_len;
        let mut tokens = Vec::new();
        tokens.try_reserve_exact(cells * is).map_err(|_| Error::invalid("seq_len", format!("{cells} tokens do not fit in memory")))?;
        for _ in 0..cells {
            tokens.extend_from_slice(&self.pad);
        }
        let mut position_ids = vec![0i64; cells];
        let mut document_ids = vec![-1i64; cells];
        let mut cu_seqlens = Vec::with_capacity(window.len() + 2 * rows + 1);
        cu_seqlens.push(0i32);
        let mut real = 0u64;
        for (r, segs) in segments.iter().enumerate() {
            let mut at = r * seq_len;
            for &(w, start, len) in segs {
                let p = &window[w];
                let src = &p.bytes()[start as usize * is..(start as usize + len) * is];
                tokens[at * is..(at + len) * is].copy_from_slice(src);
                for (k, pos) in position_ids[at..at + len].iter_mut().enumerate() {
                    *pos = (start + k as u64) as i64;
                }
                document_ids[at..at + len].fill(p.doc as i64);
                at += len;
                real += len as u64;
                cu_seqlens.push(at as i32);
            }
            if at < (r + 1) * seq_len {
                cu_seqlens.push(((r + 1) * seq_len) as i32);
            }
        }
        let tokens = Tensor::from_slice(&self.allocator, &tokens, &[cells * is])?.reinterpret(self.view.source().dtype(), vec![rows, seq_len])?;

        // What is left stays, in order, for the next step.
        self.window = window
            .into_iter()
            .zip(offsets)
            .filter_map(|(mut p, o)| {
                p.offset = o;
                (o < (p.range.len() / is) as u64).then_some(p)
            })
            .collect();
        self.cursor += need as u64;
        self.step += 1;
        Ok(Packed { tokens, position_ids, document_ids, cu_seqlens, real_tokens: real })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::RaggedBatch;
    use crate::store::{RecordSource, RecordType};
    use std::sync::Arc;

    /// Documents of the given lengths; document `d`'s token `k` is `d * 1000 + k`.
    #[derive(Debug)]
    struct Docs(Vec<usize>);

    impl RecordSource for Docs {
        fn name(&self) -> String {
            "docs".into()
        }
        fn len(&self) -> u64 {
            self.0.len() as u64
        }
        fn record_type(&self) -> RecordType {
            RecordType::ragged(DType::Int32, 1)
        }
        fn gather(&self, ids: Ids<'_>, allocator: &Allocator, _: &crate::store::ReadOptions) -> Result<Batch> {
            let mut values = Vec::new();
            let mut cu = vec![0i32];
            let mut shapes = Vec::new();
            for k in 0..ids.len() {
                let d = ids.get(k) as usize;
                values.extend((0..self.0[d]).map(|t| (d * 1000 + t) as i32));
                cu.push(values.len() as i32);
                shapes.push(self.0[d] as u64);
            }
            let input = crate::memory::RaggedInput::from_slices(&values, &cu, &shapes, 1);
            Ok(Batch::Ragged(RaggedBatch::copy_from_input(allocator, &input)?))
        }
    }

    fn packer(lens: Vec<usize>, rows: usize, seq_len: usize, lookahead: usize, mode: Mode) -> Packer {
        let view = SourceView::new(Arc::new(Docs(lens)), &Allocator::cpu(0));
        Packer::new(view, mode, 7, 0, 1, PackOptions { rows, seq_len, lookahead, pad_id: -1 }).unwrap()
    }

    /// (document, token offset) of every real token of `n` batches, in order.
    fn tokens_of(p: &mut Packer, n: usize) -> Vec<Vec<(i64, i64)>> {
        (0..n)
            .map(|_| {
                let b = p.next_batch().unwrap();
                let t = b.tokens.as_slice::<i32>().unwrap().to_vec();
                let mut out = Vec::new();
                for (k, (&d, &pos)) in b.document_ids.iter().zip(&b.position_ids).enumerate() {
                    if d >= 0 {
                        assert_eq!(t[k] as i64, d * 1000 + pos, "the token is the document's token at its position");
                        out.push((d, pos));
                    } else {
                        assert_eq!(t[k], -1);
                    }
                }
                assert_eq!(out.len() as u64, b.real_tokens);
                out
            })
            .collect()
    }

    #[test]
    fn first_fit_packs_every_token_once_and_cuts_long_documents() {
        let lens: Vec<usize> = vec![5, 3, 9, 2, 20, 0, 4, 1, 7, 6];
        for mode in [Mode::Sequential, Mode::Cyclic] {
            let mut p = packer(lens.clone(), 2, 8, 4, mode);
            let mut placed: Vec<(i64, i64)> = tokens_of(&mut p, 12).concat();
            // Conservation: what was placed plus what waits in the window is every token of
            // every document pulled so far (over several epochs), each exactly once.
            let st = p.state();
            for &(d, off) in &st.window {
                placed.extend((off as i64..lens[d as usize] as i64).map(|k| (d as i64, k)));
            }
            let mut pulled: Vec<(i64, i64)> = (0..st.cursor).flat_map(|j| {
                let d = p.doc_at(j).unwrap();
                (0..lens[d as usize] as i64).map(move |k| (d as i64, k))
            }).collect();
            placed.sort_unstable();
            pulled.sort_unstable();
            assert_eq!(placed, pulled, "{mode:?}");
            assert!(st.cursor > 2 * lens.len() as u64, "several epochs were packed");
        }
        // Step 0, window [0:5, 1:3, 2:9, 3:2]: row 0 = doc 0 + doc 1, row 1 = doc 2 cut at 8,
        // doc 3 waits (no room), so row 1 ends with doc 2's first piece.
        let mut q = packer(lens, 2, 8, 4, Mode::Sequential);
        let b = q.next_batch().unwrap();
        assert_eq!(&b.document_ids[..8], &[0, 0, 0, 0, 0, 1, 1, 1]);
        assert_eq!(&b.document_ids[8..], &[2; 8]);
        assert_eq!(b.cu_seqlens, vec![0, 5, 8, 16]);
        assert_eq!(q.state(), PackState { step: 1, cursor: 4, window: vec![(2, 8), (3, 0)] });
        let b = q.next_batch().unwrap();
        // Window [2:8.., 3, 4, 5(empty), 6, 7] topped up to 4 entries: [2, 3, 4, 5].
        assert_eq!(&b.document_ids[..3], &[2, 3, 3]);
        assert_eq!(&b.position_ids[..3], &[8, 0, 1]);
    }

    #[test]
    fn a_restored_state_continues_exactly() {
        let lens: Vec<usize> = (0..60).map(|i| (i * 7 + 3) % 23).collect();
        let mut whole = packer(lens.clone(), 3, 16, 8, Mode::Cyclic);
        let all = tokens_of(&mut whole, 20);
        let mut first = packer(lens.clone(), 3, 16, 8, Mode::Cyclic);
        let head = tokens_of(&mut first, 7);
        let state = first.state();
        let mut second = packer(lens, 3, 16, 8, Mode::Cyclic);
        second.restore(&state).unwrap();
        let tail = tokens_of(&mut second, 13);
        assert_eq!([head, tail].concat(), all);
    }

    #[test]
    fn bad_options_and_states_are_typed_errors() {
        let view = || SourceView::new(Arc::new(Docs(vec![3, 4])), &Allocator::cpu(0));
        let o = PackOptions { rows: 2, seq_len: 8, lookahead: 4, pad_id: 0 };
        for bad in [
            PackOptions { rows: 0, ..o },
            PackOptions { seq_len: 0, ..o },
            PackOptions { lookahead: 0, ..o },
            PackOptions { rows: 1 << 20, seq_len: 1 << 20, ..o },
            PackOptions { pad_id: 1 << 40, ..o },
        ] {
            assert!(matches!(Packer::new(view(), Mode::Cyclic, 0, 0, 1, bad), Err(Error::InvalidArgument { .. })), "{bad:?}");
        }
        assert!(Packer::new(view(), Mode::Cyclic, 0, 1, 1, o).is_err());
        let mut p = Packer::new(view(), Mode::Cyclic, 0, 0, 1, o).unwrap();
        assert!(p.restore(&PackState { step: 0, cursor: 0, window: vec![(5, 0)] }).is_err());
        assert!(p.restore(&PackState { step: 0, cursor: 0, window: vec![(0, 4)] }).is_err());
        assert!(p.restore(&PackState { step: 0, cursor: 0, window: vec![(0, 0); 5] }).is_err());
    }
}
