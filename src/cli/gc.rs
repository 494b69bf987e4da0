//! `zrec gc DIR|URL`: what crashed writers left (staging folders, unreferenced uploads).



/// `zrec gc URL`: data folders below the store (or the stores of a dataset root) at URL that
/// no manifest names: uploads of writers that crashed or lost a race.
pub(super) fn gc_remote(url: &str, dry_run: bool) -> crate::Result<()> {
    use crate::store::publish::remote_leftovers;
    let crate::io::Uri::Remote(root) = crate::io::Uri::parse(url)? else {
        return Err(crate::Error::invalid("url", format!("'{url}' is not an object-store URL")));
    };
    let mut found = remote_leftovers(&root, !dry_run)?;
    for d in root.list_dirs()? {
        if !d.starts_with("upload-") {
            found.extend(remote_leftovers(&root.join(&d), !dry_run)?);
        }
    }
    for (u, n) in &found {
        if dry_run {
            println!("would remove: {u}/");
        } else {
            println!("removed: {u}/ ({n} objects)");
        }
    }
    println!("{} leftover data folder(s){}", found.len(), if dry_run { " (dry run)" } else { " removed" });
    Ok(())
}

pub(super) fn gc(dir: &std::path::Path, dry_run: bool, all: bool) -> crate::Result<()> {
    use crate::io::publish::{leftovers, remove_leftovers};
    if crate::io::is_url(dir) {
        return gc_remote(dir.to_str().unwrap_or_default(), dry_run);
    }
    let found = if dry_run { leftovers(dir)? } else { remove_leftovers(dir, all)? };
    let mut total = 0;
    for l in &found {
        let state = if l.writer_alive { "writer running" } else { "writer gone" };
        let verb = if dry_run && (all || !l.writer_alive) { "would remove" } else if dry_run { "kept" } else { "removed" };
        println!("{verb}: {} (for {}, pid {}, {state}, {} bytes)", l.path.display(), l.dest.display(), l.pid, l.bytes);
        if verb != "kept" {
            total += l.bytes;
        }
    }
    println!("{} leftover folder(s), {total} bytes{}", found.len(), if dry_run { " (dry run)" } else { " freed" });
    Ok(())
}
