//! [`TextPipeline`]: text stages fused into one pass per row.

use arrow_array::{Array, BooleanArray, StringViewArray};
use arrow_buffer::{Buffer, NullBuffer, ScalarBuffer};
use rayon::prelude::*;

use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::text::tensor::{par_mask, rows_per_task, worth_parallel};
use crate::text::{Cleaner, ExactDedup, NearDedup, PiiMasker, QualityFilter, StringTensor};

/// One text stage.
#[derive(Clone, Debug)]
pub enum Stage {
    /// Rewrite: [`Cleaner`].
    Clean(Cleaner),
    /// Keep or drop: [`QualityFilter`].
    Quality(QualityFilter),
    /// Rewrite: [`PiiMasker`].
    Pii(PiiMasker),
    /// Keep the first occurrence of each text (XXH3-64 of the text at this point): a shared,
    /// stateful [`ExactDedup`]. Rows are checked in row order, so the result is deterministic.
    Dedup(Arc<Mutex<ExactDedup>>),
    /// Keep texts that are not near duplicates (MinHash + LSH) of a text kept before: a
    /// shared, stateful [`NearDedup`], checked in row order.
    NearDedup(Arc<Mutex<NearDedup>>),
}

impl Stage {
    /// `clean`, `quality` or `pii`.
    pub fn name(&self) -> &'static str {
        match self {
            Stage::Clean(_) => "clean",
            Stage::Quality(_) => "quality",
            Stage::Pii(_) => "pii",
            Stage::Dedup(_) => "dedup",
            Stage::NearDedup(_) => "near_dedup",
        }
    }
}

/// The result of a pipeline over a batch.
#[derive(Clone, Debug)]
pub struct StageOutput {
    /// Every row's text after the stages (a dropped row keeps the text it had where the
    /// pipeline stopped working on it: see [`TextPipeline::run`]; nulls stay null).
    pub text: StringTensor,
    /// True for rows every stage kept (false for dropped and null rows).
    pub keep: BooleanArray,
}

impl StageOutput {
    /// Only the kept rows (bytes shared).
    pub fn kept(&self) -> Result<StringTensor> {
        self.text.filter(&self.keep)
    }
}

/// Stages run in order on every row in one pass: a row that a filter drops skips the stages
/// after it, and a row no stage changes keeps its input view (no bytes copied).
#[derive(Clone, Debug, Default)]
pub struct TextPipeline {
    stages: Vec<Stage>,
}

/// Rows' new texts produced by one task.
struct Part {
    /// One view per row, in the task's local buffer numbering for rewritten rows.
    views: Vec<u128>,
    /// Rows whose view points into `buffers` (the rest are the input's views).
    rewritten: Vec<bool>,
    buffers: Vec<Vec<u8>>,
    /// Per row: the index of the filter stage that dropped it, `stages.len()` when every
    /// filter passed it, [`NOT_RUN`] for null rows.
    reached: Vec<u16>,
    /// Per dedup stage: each row's key there (`width` u64 per row: the XXH3 of its text at that
    /// point, or its MinHash signature; zeros when the row did not reach the stage).
    keys: Vec<Vec<u64>>,
}

/// `reached` of a row no stage ran on (null).
const NOT_RUN: u16 = u16::MAX;

/// What the parallel pass computes at a dedup stage.
enum KeyFn {
    Hash,
    Signature(Arc<crate::text::Signer>, usize),
}

impl KeyFn {
    fn width(&self) -> usize {
        match self {
            KeyFn::Hash => 1,
            KeyFn::Signature(_, w) => *w,
        }
    }
}

impl TextPipeline {
    /// A pipeline of `stages`.
    pub fn new(stages: Vec<Stage>) -> TextPipeline {
        TextPipeline { stages }
    }

    /// The stages.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Run one row through the stages. Returns (rewritten, kept): when rewritten, `a` holds
    /// the new text (else the input stands); kept is false when a filter dropped the row
    /// (later stages did not run). `b` is scratch.
    pub fn run_one(&self, text: &str, a: &mut String, b: &mut String) -> Result<(bool, bool)> {
        run_stages(&self.stages, text, a, b)
    }

    /// Run the stages over every row: each row goes through the stages in order and stops at
    /// the first stage that drops it. Filters and rewrites run in parallel; at a dedup stage the
    /// parallel pass records each row's key there (XXH3-64 of its text, or its MinHash
    /// signature), then the stage decides in row order, so results are deterministic and equal
    /// to running the stages one after the other. The pass is cut after each dedup stage: a
    /// row a dedup stage drops never reaches the (possibly expensive) stages after it. (A
    /// dedup state listed at several places is decided at all of them row by row, as
    /// [`TextPipeline::run_one`] does; the stages between those places run on the rows the
    /// filters before them kept.) A dropped row keeps the text it had where the pipeline
    /// stopped working on it.
    pub fn run(&self, input: &StringTensor) -> Result<StageOutput> {
        if self.stages.len() >= NOT_RUN as usize {
            return Err(crate::Error::invalid("stages", format!("{} stages (at most {})", self.stages.len(), NOT_RUN - 1)));
        }
        let n = input.len();
        let arr = input.as_arrow();
        let mut keep: Vec<bool> = (0..n).map(|i| !arr.is_null(i)).collect();
        let mut text = input.clone();
        for (lo, hi) in segments(&self.stages) {
            let stages = &self.stages[lo..hi];
            if !keep.iter().any(|&k| k) {
                break;
            }
            // Key functions of the segment's dedup stages, detached from their (locked) state.
            let key_fns: Vec<(usize, KeyFn)> = stages
                .iter()
                .enumerate()
                .filter_map(|(j, st)| match st {
                    Stage::Dedup(_) => Some((j, KeyFn::Hash)),
                    Stage::NearDedup(d) => {
                        let d = d.lock().unwrap_or_else(|p| p.into_inner());
                        let w = d.permutations().0.len();
                        Some((j, KeyFn::Signature(d.signer(), w)))
                    }
                    _ => None,
                })
                .collect();
            let (out, reached, keys) = run_pass(stages, &key_fns, &text, &keep)?;
            text = out;
            let all = stages.len() as u16;
            for (k, &r) in keep.iter_mut().zip(&reached) {
                *k = r == all;
            }
            if !key_fns.is_empty() {
                decide(stages, &key_fns, &reached, &keys, &mut keep)?;
            }
        }
        let bits = par_mask(n, |r| keep[r]);
        Ok(StageOutput { text, keep: BooleanArray::new(bits, None) })
    }
}

/// The pipeline's passes as stage ranges: each ends after a dedup stage (or at the end), except
/// where a dedup state is also listed at a later dedup stage (those places decide together).
fn segments(stages: &[Stage]) -> Vec<(usize, usize)> {
    let state = |st: &Stage| -> Option<*const ()> {
        match st {
            Stage::Dedup(d) => Some(Arc::as_ptr(d) as *const ()),
            Stage::NearDedup(d) => Some(Arc::as_ptr(d) as *const ()),
            _ => None,
        }
    };
    let mut out = Vec::new();
    let mut lo = 0;
    for (j, st) in stages.iter().enumerate() {
        if state(st).is_none() {
            continue;
        }
        let before: Vec<*const ()> = stages[lo..=j].iter().filter_map(state).collect();
        if !stages[j + 1..].iter().filter_map(state).any(|p| before.contains(&p)) {
            out.push((lo, j + 1));
            lo = j + 1;
        }
    }
    if lo < stages.len() || out.is_empty() {
        out.push((lo, stages.len()));
    }
    out
}

/// The ordered decisions of one pass's dedup stages: a row reaching a dedup stage is checked
/// (and recorded) there; a duplicate is dropped and does not reach the next dedup stage.
fn decide(stages: &[Stage], key_fns: &[(usize, KeyFn)], reached: &[u16], keys: &[Vec<u64>], keep: &mut [bool]) -> Result<()> {
    enum Locked<'a> {
        Exact(std::sync::MutexGuard<'a, ExactDedup>),
        Near(std::sync::MutexGuard<'a, NearDedup>),
    }
    // Each distinct state locked once for the batch (a state listed twice is one lock).
    let mut locked: Vec<Locked<'_>> = Vec::new();
    let mut seen: Vec<*const ()> = Vec::new();
    let mut guard_of: Vec<usize> = Vec::with_capacity(key_fns.len());
    for st in stages {
        let ptr = match st {
            Stage::Dedup(d) => Arc::as_ptr(d) as *const (),
            Stage::NearDedup(d) => Arc::as_ptr(d) as *const (),
            _ => continue,
        };
        if let Some(g) = seen.iter().position(|&p| p == ptr) {
            guard_of.push(g);
            continue;
        }
        seen.push(ptr);
        locked.push(match st {
            Stage::NearDedup(d) => Locked::Near(d.lock().unwrap_or_else(|p| p.into_inner())),
            Stage::Dedup(d) => Locked::Exact(d.lock().unwrap_or_else(|p| p.into_inner())),
            _ => continue,
        });
        guard_of.push(locked.len() - 1);
    }
    for (r, &reach) in reached.iter().enumerate() {
        if reach == NOT_RUN {
            continue;
        }
        for (d, (j, f)) in key_fns.iter().enumerate() {
            if *j as u16 >= reach {
                break; // a filter before this stage dropped the row
            }
            let w = f.width();
            let key = &keys[d][r * w..(r + 1) * w];
            let new = match &mut locked[guard_of[d]] {
                Locked::Exact(set) => set.insert_one(key[0])?,
                Locked::Near(nd) => nd.insert_signature(key),
            };
            if !new {
                keep[r] = false;
                break;
            }
        }
    }
    Ok(())
}

/// One row through `stages` (see [`TextPipeline::run_one`]).
fn run_stages(stages: &[Stage], text: &str, a: &mut String, b: &mut String) -> Result<(bool, bool)> {
    let mut rewritten = false;
    for stage in stages {
        let src: &str = if rewritten { a.as_str() } else { text };
        let changed = match stage {
            Stage::Quality(q) => {
                if !q.keep(src) {
                    return Ok((rewritten && a.as_str() != text, false));
                }
                false
            }
            Stage::Clean(c) => c.clean_into(src, b),
            Stage::Pii(p) => p.mask_into(src, b),
            Stage::Dedup(d) => {
                let h = crate::text::tensor::xxh3(src.as_bytes(), 0);
                if !d.lock().unwrap_or_else(|p| p.into_inner()).insert(&[h])?[0] {
                    return Ok((rewritten && a.as_str() != text, false));
                }
                false
            }
            Stage::NearDedup(d) => {
                if !d.lock().unwrap_or_else(|p| p.into_inner()).insert(&[src])[0] {
                    return Ok((rewritten && a.as_str() != text, false));
                }
                false
            }
        };
        if changed {
            std::mem::swap(a, b);
            rewritten = true;
        }
    }
    Ok((rewritten && a.as_str() != text, true))
}

/// One parallel pass of [`TextPipeline::run`] over the `active` rows: every row's text after the
/// stages, where each row stopped (`Part::reached`; [`NOT_RUN`] for the other rows) and the keys
/// of the dedup stages, all in row order. The other rows keep their views.
fn run_pass(stages: &[Stage], key_fns: &[(usize, KeyFn)], input: &StringTensor, active: &[bool]) -> Result<(StringTensor, Vec<u16>, Vec<Vec<u64>>)> {
    let arr = input.as_arrow();
    let n = arr.len();
    let bytes = input.total_bytes();
    let per = rows_per_task(n, bytes);
    let tasks = n.div_ceil(per);
    let work = |t: usize| -> Part {
        let (lo, hi) = (t * per, ((t + 1) * per).min(n));
        let m = hi - lo;
        // Rewrites rarely grow a text: room for the task's input bytes avoids regrowing.
        let room: usize = arr.views()[lo..hi].iter().map(|v| *v as u32 as usize).sum();
        let mut part = Part {
            views: vec![0; m],
            rewritten: vec![false; m],
            buffers: vec![Vec::with_capacity(room)],
            reached: (lo..hi).map(|i| if active[i] { stages.len() as u16 } else { NOT_RUN }).collect(),
            // Rows that do not reach a dedup stage keep zeros there (never looked at).
            keys: key_fns.iter().map(|(_, f)| vec![0u64; m * f.width()]).collect(),
        };
        // Stage-major within the task: each stage runs over the task's live rows before the
        // next one starts (its regex and lookup caches stay warm); a row's current text is the
        // input (`None`) or a range of the arena, and rewrites go to the other arena.
        let mut live: Vec<usize> = (0..m).filter(|&r| part.reached[r] != NOT_RUN).collect();
        let mut at: Vec<Option<(usize, usize)>> = vec![None; m];
        let (mut cur, mut next, mut scratch) = (String::new(), String::new(), String::new());
        let mut d = 0;
        for (j, stage) in stages.iter().enumerate() {
            next.clear();
            let mut still = Vec::with_capacity(live.len());
            for &r in &live {
                let src: &str = match at[r] {
                    None => arr.value(lo + r),
                    Some((o, l)) => &cur[o..o + l],
                };
                let changed = match stage {
                    Stage::Quality(q) => {
                        if !q.keep(src) {
                            // Dropped here: its text is final now.
                            part.reached[r] = j as u16;
                            if at[r].is_some() && src != arr.value(lo + r) {
                                part.views[r] = push_view(&mut part.buffers, src);
                                part.rewritten[r] = true;
                            } else {
                                part.views[r] = arr.views()[lo + r];
                            }
                            continue;
                        }
                        false
                    }
                    Stage::Clean(c) => c.clean_into(src, &mut scratch),
                    Stage::Pii(p) => p.mask_into(src, &mut scratch),
                    Stage::Dedup(_) | Stage::NearDedup(_) => {
                        let (_, f) = &key_fns[d];
                        let w = f.width();
                        let out = &mut part.keys[d][r * w..(r + 1) * w];
                        match f {
                            KeyFn::Hash => out[0] = crate::text::tensor::xxh3(src.as_bytes(), 0),
                            KeyFn::Signature(signer, _) => out.copy_from_slice(&signer.signature(src)),
                        }
                        false
                    }
                };
                let text: &str = if changed { scratch.as_str() } else { src };
                if changed || at[r].is_some() {
                    at[r] = Some((next.len(), text.len()));
                    next.push_str(text);
                }
                still.push(r);
            }
            if matches!(stage, Stage::Dedup(_) | Stage::NearDedup(_)) {
                d += 1;
            }
            live = still;
            std::mem::swap(&mut cur, &mut next);
        }
        for r in live {
            match at[r] {
                Some((o, l)) if &cur[o..o + l] != arr.value(lo + r) => {
                    part.views[r] = push_view(&mut part.buffers, &cur[o..o + l]);
                    part.rewritten[r] = true;
                }
                _ => part.views[r] = arr.views()[lo + r],
            }
        }
        for r in 0..m {
            if part.reached[r] == NOT_RUN {
                part.views[r] = arr.views()[lo + r];
            }
        }
        part
    };
    let parts: Vec<Part> = if tasks > 1 && (worth_parallel(n, bytes) || !stages.is_empty()) { (0..tasks).into_par_iter().map(work).collect() } else { (0..tasks).map(work).collect() };
    // Stitch: the input's buffers first, then every task's buffers in order.
    let mut buffers: Vec<Buffer> = arr.data_buffers().to_vec();
    let mut views = Vec::with_capacity(n);
    let mut reached = Vec::with_capacity(n);
    let mut keys: Vec<Vec<u64>> = key_fns.iter().map(|(_, f)| Vec::with_capacity(n * f.width())).collect();
    for part in parts {
        let base = buffers.len() as u32;
        for (v, rw) in part.views.into_iter().zip(part.rewritten) {
            if rw && (v as u32) > 12 {
                let bv = arrow_data::ByteView::from(v);
                views.push(bv.with_buffer_index(bv.buffer_index + base).as_u128());
            } else {
                views.push(v);
            }
        }
        reached.extend(part.reached);
        for (all, k) in keys.iter_mut().zip(part.keys) {
            all.extend(k);
        }
        buffers.extend(part.buffers.into_iter().map(|mut b| {
            if b.capacity() > b.len() + b.len() / 4 {
                b.shrink_to_fit(); // the reserve was for the worst case
            }
            Buffer::from_vec(b)
        }));
    }
    let nulls: Option<NullBuffer> = arr.nulls().cloned();
    // SAFETY: views of untouched rows are the input's (its buffers come first, same
    // indices); rewritten rows' views were built by `push_view` from `&str` (valid UTF-8)
    // into their task's buffers, renumbered by the count of buffers before them (every task
    // buffer is appended, empty or not). Lengths match `n`.
    let text = unsafe { StringViewArray::new_unchecked(ScalarBuffer::from(views), buffers, nulls) };
    Ok((StringTensor::new(text), reached, keys))
}

/// Append `s` to the task's buffers and return its view (inline when short). A new buffer
/// starts when the current one would pass 2 GiB.
fn push_view(buffers: &mut Vec<Vec<u8>>, s: &str) -> u128 {
    let len = s.len();
    if len <= 12 {
        let mut raw = [0u8; 16];
        raw[..4].copy_from_slice(&(len as u32).to_le_bytes());
        raw[4..4 + len].copy_from_slice(s.as_bytes());
        return u128::from_le_bytes(raw);
    }
    if buffers.last().is_some_and(|b| b.len() + len > i32::MAX as usize) {
        buffers.push(Vec::new());
    }
    let idx = buffers.len() - 1;
    let buf = &mut buffers[idx];
    let off = buf.len();
    buf.extend_from_slice(s.as_bytes());
    arrow_data::ByteView::new(len as u32, &s.as_bytes()[..4]).with_buffer_index(idx as u32).with_offset(off as u32).as_u128()
}
