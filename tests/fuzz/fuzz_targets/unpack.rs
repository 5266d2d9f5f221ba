//! The layer unpacker on arbitrary bytes (a layer blob: tar, gzip or zstd).
//! Whatever it is given, it may fail but must not panic, and must write
//! nothing outside its destination: the sandbox dir holds only the blob,
//! the destination and a decoy after each run, and the decoy is untouched.

#![no_main]

use std::fs;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use nanolet::image::unpack::{Limits, unpack};

fn sandbox() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::var_os("NANOLET_FUZZ_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
        let dir = base.join(format!("nanolet-fuzz-{}", std::process::id()));
        fs::create_dir_all(dir.join("decoy")).expect("sandbox");
        fs::write(dir.join("decoy/file"), b"decoy").expect("decoy");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = sandbox();
    let blob = dir.join("blob");
    let dest = dir.join("dest");
    fs::write(&blob, data).expect("blob");
    // Small limits: a bomb is caught, and runs stay fast.
    let limits = Limits {
        max_bytes: 4 << 20,
        max_entries: 10_000,
        ..Limits::default()
    };
    let _ = unpack(&blob, &dest, limits);
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("sandbox")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(
        names.iter().all(|n| ["blob", "decoy", "dest"].contains(&n.as_str())),
        "written outside the layer: {names:?}"
    );
    let decoy: Vec<_> = fs::read_dir(dir.join("decoy")).expect("decoy").collect();
    assert_eq!(decoy.len(), 1, "the decoy dir changed");
    assert_eq!(fs::read(dir.join("decoy/file")).expect("decoy"), b"decoy");
    // Fuzzed as root (the unpacker chowns and makes whiteouts), so read-only
    // dirs the layer made do not stop this.
    let _ = fs::remove_dir_all(&dest);
});
