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
    /// Every row's text after the stages (a dropped row keeps the text it had when dropped;
    /// nulls stay null).
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
    keep: Vec<bool>,
    error: Option<crate::Error>,
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

    /// Run the stages over every row (in parallel over tasks of rows; a dedup stage checks
    /// the surviving rows in row order between the parallel segments around it).
    pub fn run(&self, input: &StringTensor) -> Result<StageOutput> {
        let mut text = input.clone();
        let mut keep: Option<Vec<bool>> = None;
        let mut i = 0;
        while i < self.stages.len() {
            if matches!(self.stages[i], Stage::Dedup(_) | Stage::NearDedup(_)) {
                let arr = text.as_arrow();
                let mut k = keep.take().unwrap_or_else(|| (0..arr.len()).map(|r| arr.is_valid(r)).collect());
                let rows: Vec<usize> = (0..k.len()).filter(|&r| k[r]).collect();
                let new = match &self.stages[i] {
                    Stage::Dedup(d) => {
                        // Only the rows still kept are hashed (in parallel when worth it).
                        let hash = |&r: &usize| crate::text::tensor::xxh3(arr.value(r).as_bytes(), 0);
                        let hs: Vec<u64> = if worth_parallel(rows.len(), input.total_bytes()) { rows.par_iter().with_min_len(256).map(hash).collect() } else { rows.iter().map(hash).collect() };
                        d.lock().unwrap_or_else(|p| p.into_inner()).insert(&hs)?
                    }
                    Stage::NearDedup(d) => {
                        let texts: Vec<&str> = rows.iter().map(|&r| arr.value(r)).collect();
                        d.lock().unwrap_or_else(|p| p.into_inner()).insert(&texts)
                    }
                    _ => vec![true; rows.len()],
                };
                for (r, n) in rows.into_iter().zip(new) {
                    k[r] = n;
                }
                keep = Some(k);
                i += 1;
                continue;
            }
            let j = (i..self.stages.len()).find(|&j| matches!(self.stages[j], Stage::Dedup(_) | Stage::NearDedup(_))).unwrap_or(self.stages.len());
            let (t, k) = run_segment(&self.stages[i..j], &text, keep.as_deref())?;
            text = t;
            keep = Some(k);
            i = j;
        }
        let arr = text.as_arrow();
        let k = keep.unwrap_or_else(|| (0..arr.len()).map(|r| arr.is_valid(r)).collect());
        let bits = par_mask(k.len(), |r| k[r]);
        Ok(StageOutput { text, keep: BooleanArray::new(bits, None) })
    }
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

/// Stateless stages over the rows still `active` (all non-null rows when `None`), in parallel:
/// the new texts and which rows survived.
fn run_segment(stages: &[Stage], input: &StringTensor, active: Option<&[bool]>) -> Result<(StringTensor, Vec<bool>)> {
        let arr = input.as_arrow();
        let n = arr.len();
        let bytes = input.total_bytes();
        let per = rows_per_task(n, bytes);
        let tasks = n.div_ceil(per);
        let work = |t: usize| -> Part {
            let (lo, hi) = (t * per, ((t + 1) * per).min(n));
            // Rewrites rarely grow a text: room for the task's input bytes avoids regrowing.
            let room: usize = arr.views()[lo..hi].iter().map(|v| *v as u32 as usize).sum();
            let mut part = Part { views: Vec::with_capacity(hi - lo), rewritten: Vec::with_capacity(hi - lo), buffers: vec![Vec::with_capacity(room)], keep: Vec::with_capacity(hi - lo), error: None };
            let (mut a, mut b) = (String::new(), String::new());
            for i in lo..hi {
                if arr.is_null(i) || active.is_some_and(|a| !a[i]) {
                    part.views.push(arr.views()[i]);
                    part.rewritten.push(false);
                    part.keep.push(false);
                    continue;
                }
                let (rewritten, keep) = match run_stages(stages, arr.value(i), &mut a, &mut b) {
                    Ok(r) => r,
                    Err(e) => {
                        part.error = Some(e);
                        return part;
                    }
                };
                part.keep.push(keep);
                if rewritten {
                    part.views.push(push_view(&mut part.buffers, &a));
                } else {
                    part.views.push(arr.views()[i]);
                }
                part.rewritten.push(rewritten);
            }
            part
        };
        let parts: Vec<Part> = if tasks > 1 && (worth_parallel(n, bytes) || !stages.is_empty()) { (0..tasks).into_par_iter().map(work).collect() } else { (0..tasks).map(work).collect() };
        // Stitch: the input's buffers first, then every task's buffers in order.
        let mut buffers: Vec<Buffer> = arr.data_buffers().to_vec();
        let mut views = Vec::with_capacity(n);
        let mut keep = Vec::with_capacity(n);
        for mut part in parts {
            if let Some(e) = part.error.take() {
                return Err(e);
            }
            let base = buffers.len() as u32;
            for (v, rw) in part.views.into_iter().zip(part.rewritten) {
                if rw && (v as u32) > 12 {
                    let bv = arrow_data::ByteView::from(v);
                    views.push(bv.with_buffer_index(bv.buffer_index + base).as_u128());
                } else {
                    views.push(v);
                }
            }
            keep.extend(part.keep);
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
        // into their task's buffers, renumbered by the count of buffers before them; empty task
        // buffers are skipped only when no view refers to them (a long view always lands in a
        // non-empty buffer). Lengths match `n`.
        let text = unsafe { StringViewArray::new_unchecked(ScalarBuffer::from(views), buffers, nulls) };
        Ok((StringTensor::new(text), keep))
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
