//! How much disk a directory takes, as upstream's kubelet measures volumes
//! (`du -x -s -B 1`): allocated blocks, not apparent sizes, each hard-linked
//! file once, nothing on other filesystems, symlinks not followed. A walk of
//! the tree: callers run it off the event loop.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Bytes allocated under `root` (itself included).
pub fn disk_usage(root: &Path) -> io::Result<u64> {
    let top = std::fs::symlink_metadata(root)?;
    let device = top.dev();
    let mut seen_links = HashSet::new();
    let mut total = top.blocks() * 512;
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // Removed meanwhile: the container is writing as we count.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != device {
                continue;
            }
            if meta.nlink() > 1 && !meta.is_dir() && !seen_links.insert(meta.ino()) {
                continue;
            }
            total += meta.blocks() * 512;
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_allocated_blocks_and_hard_links_once() {
        let dir = std::env::temp_dir().join(format!("nanolet-du-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let empty = disk_usage(&dir);
        std::fs::write(dir.join("sub/data"), vec![7u8; 256 * 1024]).unwrap();
        std::fs::hard_link(dir.join("sub/data"), dir.join("again")).unwrap();
        std::os::unix::fs::symlink("/usr", dir.join("link")).unwrap();
        // A sparse file: large, nearly nothing allocated.
        std::fs::File::create(dir.join("sparse"))
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let full = disk_usage(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        let (empty, full) = (empty.unwrap(), full.unwrap());
        let grown = full - empty;
        assert!(
            (256 * 1024..300 * 1024).contains(&grown),
            "{grown} bytes for one 256 KiB file linked twice"
        );
    }
}
