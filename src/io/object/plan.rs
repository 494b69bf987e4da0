//! The preload planner: a gather's ranges coalesced per file, split, fetched together, pinned while it reads.

#[allow(unused_imports)]
use super::*;

/// Ranges a gather staged, pinned in their caches until this is dropped.
#[derive(Default)]
pub(crate) struct Staged {
    pub(super) pins: Vec<(Arc<Mutex<RangeCache>>, u32, u64)>,
}

impl Staged {
    /// Keep `other`'s pins too.
    pub(crate) fn absorb(&mut self, mut other: Staged) {
        self.pins.append(&mut other.pins);
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for (cache, file, start) in self.pins.drain(..) {
            cache.lock().unwrap_or_else(|p| p.into_inner()).unpin(file, start);
        }
    }
}

/// How [`preload`] rounds the ranges of a file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Aligned pages (index and shape rows: neighbours are likely wanted later).
    Pages,
    /// Exact ranges, coalesced across small gaps (record bytes).
    Ranges,
}

/// Bring every `(file, start, end)` range into the caches of its file, fetching what is
/// missing with coalesced ranged requests, all files' requests in flight together. The staged
/// ranges stay pinned while the returned guard lives.
pub(crate) fn preload(wanted: Vec<(&ObjectFile, u64, u64)>, plan: Plan) -> Result<Staged> {
    let mut staged = Staged::default();
    let Some(first) = wanted.first() else { return Ok(staged) };
    let opts = first.0.remote.opts.clone();
    // Group per file; drop ranges already cached (pinning them).
    let mut per_file: Vec<(&ObjectFile, Vec<Range<u64>>)> = Vec::new();
    for (f, a, z) in wanted {
        if z <= a {
            continue;
        }
        let (a, z) = if plan == Plan::Pages { let r = f.page_of(a, z - a); (r.start, r.end) } else { (a, z.min(f.len)) };
        match per_file.iter_mut().find(|(g, _)| std::ptr::eq(*g, f)) {
            Some((_, v)) => v.push(a..z),
            None => per_file.push((f, std::iter::once(a..z).collect())),
        }
    }
    let mut jobs: Vec<(usize, Vec<Range<u64>>)> = Vec::new();
    for (i, (f, ranges)) in per_file.iter_mut().enumerate() {
        ranges.sort_unstable_by_key(|r| (r.start, r.end));
        let mut missing: Vec<Range<u64>> = Vec::new();
        {
            let mut cache = f.cache();
            for r in ranges.iter() {
                if let Some((start, _)) = cache.find(f.id, r.start, r.end - r.start) {
                    if let Some(e) = cache.map.get_mut(&(f.id, start)) {
                        e.pins += 1;
                        staged.pins.push((f.cache.clone(), f.id, start));
                    }
                    continue;
                }
                missing.push(r.clone());
            }
        }
        // Ranges kept on local disk (earlier runs or processes) are read from there.
        if let Some(disk) = &f.disk {
            missing.retain(|r| match disk.read(r.clone()) {
                Some(data) => {
                    f.cache().insert(f.id, r.start, data, true, plan == Plan::Ranges);
                    staged.pins.push((f.cache.clone(), f.id, r.start));
                    false
                }
                None => true,
            });
        }
        // Coalesce across gaps, split at the request size limit (the planner Zarr's shard
        // reads use too).
        let split: Vec<Range<u64>> = crate::io::plan::coalesce(&missing, opts.coalesce_gap, opts.max_request_bytes)
            .into_iter()
            .flat_map(|read| crate::io::plan::split(read.range, opts.max_request_bytes))
            .collect();
        if !split.is_empty() {
            jobs.push((i, split));
        }
    }
    if jobs.is_empty() {
        return Ok(staged);
    }
    // One stream of requests over every file, bounded together.
    type Task = (usize, Range<u64>, Arc<dyn ObjectStore>, ObjectPath);
    let tasks: Vec<Task> = jobs
        .iter()
        .flat_map(|(i, rs)| {
            let f = per_file[*i].0;
            rs.iter().map(move |r| (*i, r.clone(), f.remote.store.clone(), f.remote.key(&f.name)))
        })
        .collect();
    let concurrency = opts.concurrency();
    type Fetch = futures::future::BoxFuture<'static, (usize, Range<u64>, object_store::Result<Bytes>)>;
    let futs: Vec<Fetch> = tasks
        .into_iter()
        .map(|(i, r, store, key)| -> Fetch {
            Box::pin(async move {
                let res = store.get_range(&key, r.clone()).await;
                (i, r, res)
            })
        })
        .collect();
    let fetched = block(async move { futures::stream::iter(futs).buffer_unordered(concurrency).collect::<Vec<_>>().await });
    let mut first_err: Option<Error> = None;
    for (i, r, res) in fetched {
        let f = per_file[i].0;
        match res {
            Ok(data) if data.len() as u64 == r.end - r.start => {
                if let Some(disk) = &f.disk {
                    disk.write(r.clone(), &data);
                }
                f.cache().insert(f.id, r.start, data, true, plan == Plan::Ranges);
                staged.pins.push((f.cache.clone(), f.id, r.start));
            }
            Ok(data) => {
                first_err.get_or_insert_with(|| Error::corrupt(&f.path, format!("asked for {} bytes at {}, the server sent {}", r.end - r.start, r.start, data.len())));
            }
            Err(e) => {
                first_err.get_or_insert_with(|| f.remote.error(&f.name, Some(r), e));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(staged),
    }
}
