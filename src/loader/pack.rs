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
///
/// This rank's stream is the global document positions `base + j * world_size + rank`, `j =
/// 0, 1, ...`; `cursor` of them were pulled. `base` is 0 until the states of a run are dealt to
/// another world size ([`Packer::reshard`]): then every position below `base` was pulled by the
/// old ranks and what they had not placed is in the new ranks' windows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackState {
    /// Steps produced.
    pub step: u64,
    /// The global position where this rank's stream starts.
    pub base: u64,
    /// Documents pulled from this rank's stream.
    pub cursor: u64,
    /// The window: (document id, tokens of it already placed), in order.
    pub window: Vec<(u64, u64)>,
    /// The rank this state belongs to.
    pub rank: u64,
    /// The number of ranks of the run.
    pub world_size: u64,
}

impl Default for PackState {
    fn default() -> Self {
        PackState { step: 0, base: 0, cursor: 0, window: Vec::new(), rank: 0, world_size: 1 }
    }
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
    base: u64,
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
        Ok(Packer { view, order, n, rank, world_size, options, itemsize, pad, allocator, base: 0, cursor: 0, step: 0, window: VecDeque::new() })
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

    /// The global position of this rank's stream position `j`.
    fn position(&self, j: u64) -> Result<u64> {
        let pos = self.base as u128 + j as u128 * self.world_size as u128 + self.rank as u128;
        u64::try_from(pos).map_err(|_| Error::invalid("state", format!("stream position {j} of rank {} overflows", self.rank)))
    }

    /// The document at global position `pos` of the document stream.
    fn doc_at_position(&self, pos: u64) -> Result<u64> {
        match &self.order {
            DocOrder::Sampler(s) => Ok(s.batch(pos)[0]),
            DocOrder::Mixture(m) => m.slot_id(pos as u128),
        }
    }

    /// This rank's stream position `j` as a document id.
    fn doc_at(&self, j: u64) -> Result<u64> {
        self.doc_at_position(self.position(j)?)
    }

    /// The epoch of the document stream (this rank's next document); for a mixture, the
    /// lowest epoch of its sources.
    pub fn epoch(&self) -> u64 {
        let pos = self.position(self.cursor).unwrap_or(u64::MAX);
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
        PackState {
            step: self.step,
            base: self.base,
            cursor: self.cursor,
            window: self.window.iter().map(|p| (p.doc, p.offset)).collect(),
            rank: self.rank,
            world_size: self.world_size,
        }
    }

    /// Deal the states of every rank of a run (`states`, one per rank, any order) to
    /// `world_size` new ranks: elastic resumption. The old ranks pulled their streams to
    /// different depths; the new streams start at the first global position no old rank
    /// reached. Old rank `r`'s window (partly placed documents at their offsets) goes to new
    /// rank `r % world_size`, and every position below that start that a slower rank had not
    /// pulled yet goes, in stream order, to the new rank holding the fewest documents. So
    /// across the change no token is packed twice and none is skipped, and with the same world
    /// size and equal cursors every rank continues exactly as it would have.
    /// The states must come from packers over the same documents, order and options as this one.
    pub fn reshard(&self, states: &[PackState], world_size: u64) -> Result<Vec<PackState>> {
        let old = states.len() as u64;
        if old == 0 {
            return Err(Error::invalid("states", "no states to resume from"));
        }
        if world_size == 0 || world_size > u32::MAX as u64 {
            return Err(Error::invalid("world_size", format!("{world_size} is not in 1..=2^32-1")));
        }
        let mut by_rank: Vec<Option<&PackState>> = vec![None; states.len()];
        for st in states {
            if st.world_size != old {
                return Err(Error::invalid("states", format!("{old} states were given, one says its run had {} ranks", st.world_size)));
            }
            if st.base != states[0].base {
                return Err(Error::invalid("states", format!("the states start at different positions ({} and {})", st.base, states[0].base)));
            }
            let slot = by_rank.get_mut(st.rank as usize).ok_or_else(|| Error::invalid("states", format!("rank {} is not in 0..{old}", st.rank)))?;
            if slot.replace(st).is_some() {
                return Err(Error::invalid("states", format!("two states of rank {}", st.rank)));
            }
        }
        let ranks: Vec<&PackState> = by_rank.into_iter().flatten().collect();
        let base = states[0].base as u128;
        // The first position no old rank pulled; positions below it that were not pulled are holes.
        let end = |r: &PackState| base + r.cursor as u128 * old as u128 + r.rank as u128;
        let frontier = ranks.iter().filter(|r| r.cursor > 0).map(|r| end(r) - old as u128 + 1).max().unwrap_or(base);
        let frontier = u64::try_from(frontier).map_err(|_| Error::invalid("states", "the stream positions overflow"))?;
        let holes: u128 = ranks.iter().map(|r| (frontier as u128).saturating_sub(end(r)).div_ceil(old as u128)).sum();
        let carried = holes + ranks.iter().map(|r| r.window.len() as u128).sum::<u128>();
        if carried > MAX_LOOKAHEAD as u128 * world_size as u128 {
            return Err(Error::invalid(
                "states",
                format!("{carried} documents would be carried over to {world_size} ranks (more than {MAX_LOOKAHEAD} each): the ranks' cursors are too far apart"),
            ));
        }
        // Old rank r's window goes to new rank r % world_size (the same world size and equal
        // cursors continue every rank as if nothing happened); each hole, in stream order, to
        // the new rank holding the fewest documents.
        let mut windows: Vec<Vec<(u64, u64)>> = vec![Vec::new(); world_size as usize];
        for r in &ranks {
            windows[(r.rank % world_size) as usize].extend_from_slice(&r.window);
        }
        let mut hole_positions: Vec<u64> = Vec::with_capacity(holes as usize);
        for r in &ranks {
            let mut p = end(r);
            while p < frontier as u128 {
                hole_positions.push(p as u64);
                p += old as u128;
            }
        }
        hole_positions.sort_unstable();
        for p in hole_positions {
            let doc = self.doc_at_position(p)?;
            let fewest = (0..windows.len()).min_by_key(|&k| windows[k].len()).unwrap_or(0);
            windows[fewest].push((doc, 0));
        }
        let step = ranks.iter().map(|r| r.step).max().unwrap_or(0);
        Ok(windows
            .into_iter()
            .enumerate()
            .map(|(r, window)| PackState { step, base: frontier, cursor: 0, window, rank: r as u64, world_size })
            .collect())
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
    /// The state must be this rank's (`rank`, `world_size`); [`Packer::restore_elastic`]
    /// resumes from the states of a run on another world size.
    pub fn restore(&mut self, state: &PackState) -> Result<()> {
        if (state.rank, state.world_size) != (self.rank, self.world_size) {
            return Err(Error::invalid(
                "state",
                format!(
                    "the state is rank {}'s of {}, this packer is rank {} of {}: resume from every rank's state (restore_elastic / load_state_dict(list))",
                    state.rank, state.world_size, self.rank, self.world_size
                ),
            ));
        }
        // A window longer than the lookahead comes from a reshard (it drains before the stream
        // is read again).
        if state.window.len() > MAX_LOOKAHEAD {
            return Err(Error::invalid("state", format!("a window of {} documents exceeds {MAX_LOOKAHEAD}", state.window.len())));
        }
        if let Some(&(d, _)) = state.window.iter().find(|(d, _)| *d >= self.n) {
            return Err(Error::invalid("state", format!("document {d} is outside the {} of the source", self.n)));
        }
        let docs: Vec<u64> = state.window.iter().map(|&(d, _)| d).collect();
        let offsets: Vec<u64> = state.window.iter().map(|&(_, o)| o).collect();
        let window = self.read(&docs, &offsets)?;
        if state.base as u128 + state.cursor as u128 * self.world_size as u128 + self.rank as u128 > u64::MAX as u128 {
            return Err(Error::invalid("state", format!("stream position {} past {} overflows", state.cursor, state.base)));
        }
        self.base = state.base;
        self.window = window.into();
        self.cursor = state.cursor;
        self.step = state.step;
        Ok(())
    }

    /// Resume from the states of every rank of a run, on this packer's world size (the same
    /// or another): [`Packer::reshard`], then this rank's part.
    pub fn restore_elastic(&mut self, states: &[PackState]) -> Result<()> {
        let mut mine = self.reshard(states, self.world_size)?;
        let st = mine.swap_remove(self.rank as usize);
        self.restore(&st)
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
        assert_eq!(q.state(), PackState { step: 1, cursor: 4, window: vec![(2, 8), (3, 0)], ..Default::default() });
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
        for bad in [
            PackState { window: vec![(5, 0)], ..Default::default() },
            PackState { window: vec![(0, 4)], ..Default::default() },
            PackState { window: vec![(0, 0); MAX_LOOKAHEAD + 1], ..Default::default() },
            PackState { rank: 1, world_size: 2, ..Default::default() },
            PackState { base: u64::MAX, cursor: 1, ..Default::default() },
        ] {
            assert!(matches!(p.restore(&bad), Err(Error::InvalidArgument { .. })), "{bad:?}");
        }
        assert_eq!(p.state(), PackState::default(), "a refused state changes nothing");
        // Elastic: one state per rank, from one run, not too far apart.
        let st = |rank, world_size, cursor| PackState { rank, world_size, cursor, ..Default::default() };
        for bad in [
            vec![],
            vec![st(0, 2, 0)],
            vec![st(0, 2, 0), st(0, 2, 0)],
            vec![st(0, 2, 0), st(2, 2, 0)],
            vec![st(0, 2, 0), PackState { base: 4, ..st(1, 2, 0) }],
            vec![st(0, 2, 0), st(1, 2, 1 << 40)],
        ] {
            assert!(matches!(p.restore_elastic(&bad), Err(Error::InvalidArgument { .. })), "{bad:?}");
        }
        assert!(p.reshard(&[st(0, 1, 3)], 0).is_err());
    }

    /// Every token of the documents at `positions` of the global stream, as (doc, offset).
    fn all_tokens(p: &Packer, lens: &[usize], positions: impl Iterator<Item = u64>) -> Vec<(i64, i64)> {
        positions
            .flat_map(|g| {
                let d = p.doc_at_position(g).unwrap();
                (0..lens[d as usize] as i64).map(move |k| (d as i64, k))
            })
            .collect()
    }

    #[test]
    fn elastic_resumption_packs_every_token_once_across_world_size_changes() {
        // 2 ranks for k steps, then 3 ranks, then 1 (and other paths): the tokens placed by
        // every rank of every phase plus what waits in the last windows are exactly the tokens
        // of the documents pulled from the global stream, each once.
        let mut seed = 11u64;
        let mut rnd = |m: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        for case in 0..24 {
            let n = 20 + rnd(60) as usize;
            let lens: Vec<usize> = (0..n).map(|_| rnd(40) as usize).collect();
            let (rows, seq_len, lookahead) = (1 + rnd(3) as usize, 4 + rnd(20) as usize, 1 + rnd(8) as usize);
            let mode = [Mode::Sequential, Mode::Cyclic, Mode::Iid][case % 3];
            let worlds: Vec<u64> = (0..3).map(|_| 1 + rnd(4)).collect();
            let make = |rank, world| {
                let view = SourceView::new(Arc::new(Docs(lens.clone())), &Allocator::cpu(0));
                Packer::new(view, mode, 5, rank, world, PackOptions { rows, seq_len, lookahead, pad_id: -1 }).unwrap()
            };
            let mut placed = Vec::new();
            let mut states: Vec<PackState> = Vec::new();
            for (phase, &world) in worlds.iter().enumerate() {
                let mut ranks: Vec<Packer> = (0..world).map(|r| make(r, world)).collect();
                if phase > 0 {
                    for p in &mut ranks {
                        p.restore_elastic(&states).unwrap();
                    }
                }
                let steps = 1 + rnd(6) as usize;
                for p in &mut ranks {
                    placed.extend(tokens_of(p, steps).concat());
                }
                states = ranks.iter().map(Packer::state).collect();
                states.reverse(); // any order
            }
            let p = make(0, 1);
            let last = &states[0];
            let w = last.world_size;
            let mut pulled = all_tokens(&p, &lens, 0..last.base);
            for st in &states {
                pulled.extend(all_tokens(&p, &lens, (0..st.cursor).map(|j| last.base + j * w + st.rank)));
                for &(d, off) in &st.window {
                    placed.extend((off as i64..lens[d as usize] as i64).map(|k| (d as i64, k)));
                }
            }
            placed.sort_unstable();
            pulled.sort_unstable();
            assert_eq!(placed.len(), pulled.len(), "case {case}: worlds {worlds:?}, {mode:?}");
            assert_eq!(placed, pulled, "case {case}: worlds {worlds:?}, {mode:?}");
        }
    }

    #[test]
    fn resharding_to_the_same_world_size_continues_each_rank_exactly() {
        // Equal cursors and a world of the same size: nothing is carried between ranks beyond
        // their own windows, so every rank yields what it would have without the restart.
        let lens: Vec<usize> = (0..80).map(|i| 1 + (i * 5) % 9).collect();
        let make = |rank| {
            let view = SourceView::new(Arc::new(Docs(lens.clone())), &Allocator::cpu(0));
            Packer::new(view, Mode::Sequential, 0, rank, 2, PackOptions { rows: 1, seq_len: 64, lookahead: 4, pad_id: -1 }).unwrap()
        };
        let (mut a, mut b) = (make(0), make(1));
        let whole = [tokens_of(&mut a, 6), tokens_of(&mut b, 6)];
        let (mut a, mut b) = (make(0), make(1));
        tokens_of(&mut a, 3);
        tokens_of(&mut b, 3);
        let states = [a.state(), b.state()];
        assert_eq!(states[0].cursor, states[1].cursor);
        let (mut a2, mut b2) = (make(0), make(1));
        a2.restore_elastic(&states).unwrap();
        b2.restore_elastic(&states).unwrap();
        assert_eq!(tokens_of(&mut a2, 3), whole[0][3..]);
        assert_eq!(tokens_of(&mut b2, 3), whole[1][3..]);
    }
}
