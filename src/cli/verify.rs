//! `zrec verify PATH`: check every byte against the manifest's checksums.

use super::*;

pub(super) fn verify(path: PathBuf, quiet: bool) -> Result<u64> {
    if !crate::store::is_store(&path)? {
        let ds = Dataset::open(&path)?;
        let mut total = 0;
        if !ds.parts().is_empty() {
            // A multi-part root: every part is a root of its own.
            for p in ds.parts() {
                total += verify(path.join(&p.path), quiet)?;
            }
            return Ok(total);
        }
        for st in ds.streams() {
            let store = st.store().ok_or_else(|| Error::invalid("verify", format!("stream '{}' is not a local store", st.name)))?;
            total += verify(store.path().to_path_buf(), quiet)?;
        }
        return Ok(total);
    }
    let s = Store::open(&path)?;
    let pb = if quiet { ProgressBar::hidden() } else { ProgressBar::new(s.len()) };
    pb.set_style(
        ProgressStyle::with_template("{spinner} verify [{bar:40}] {pos}/{len} records ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let r = s.verify_with(&|done| pb.set_position(done));
    pb.finish_and_clear();
    r
}
