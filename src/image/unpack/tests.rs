use super::*;

fn temp() -> crate::state::TestDir {
    crate::state::TestDir::new("unpack")
}

enum E<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    Char(&'a str),
    Fifo(&'a str),
    Setuid(&'a str),
    /// A directory of the given mode.
    DirMode(&'a str, u32),
    /// A GNU long-name header claiming `size` bytes, with `body`.
    LongName(u64, &'a [u8]),
}

/// Writes a tar by hand so that hostile names reach the unpacker
/// unchanged (tar::Builder refuses some of them).
fn layer(dir: &Path, entries: &[E]) -> PathBuf {
    let mut data = Vec::new();
    for e in entries {
        let mut h = tar::Header::new_old();
        let (name, kind, body, link): (&str, tar::EntryType, &[u8], &str) = match e {
            E::File(n, b) => (n, tar::EntryType::Regular, b, ""),
            E::Dir(n) => (n, tar::EntryType::Directory, b"", ""),
            E::Symlink(n, t) => (n, tar::EntryType::Symlink, b"", t),
            E::Hardlink(n, t) => (n, tar::EntryType::Link, b"", t),
            E::Char(n) => (n, tar::EntryType::Char, b"", ""),
            E::Fifo(n) => (n, tar::EntryType::Fifo, b"", ""),
            E::Setuid(n) => (n, tar::EntryType::Regular, b"", ""),
            E::DirMode(n, _) => (n, tar::EntryType::Directory, b"", ""),
            E::LongName(_, b) => ("././@LongLink", tar::EntryType::GNULongName, b, ""),
        };
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(kind);
        h.set_size(match e {
            E::LongName(claimed, _) => *claimed,
            _ => body.len() as u64,
        });
        h.set_mode(match e {
            E::Dir(_) => 0o755,
            E::DirMode(_, mode) => *mode,
            E::Setuid(_) => 0o4755,
            _ => 0o644,
        });
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        data.extend_from_slice(h.as_bytes());
        data.extend_from_slice(body);
        data.resize(data.len().div_ceil(512) * 512, 0);
    }
    data.extend_from_slice(&[0; 1024]);
    let path = dir.join("layer.tar");
    fs::write(&path, data).unwrap();
    path
}

#[test]
fn plain_layer_and_whiteouts() {
    let t = temp();
    let blob = layer(
        &t.0,
        &[
            E::Dir("./etc/"),
            E::File("etc/hosts", b"127.0.0.1 x\n"),
            E::File("/abs/file", b"ok"),
            E::Symlink("etc/link", "/etc/hosts"),
            E::Hardlink("etc/hosts2", "etc/hosts"),
            E::File("gone/.wh.old", b""),
            E::File("opaque/.wh..wh..opq", b""),
            E::Char("dev/sda"),
        ],
    );
    let dest = t.0.join("out");
    let stats = unpack(&blob, &dest, Limits::default()).unwrap();
    assert_eq!(fs::read(dest.join("etc/hosts")).unwrap(), b"127.0.0.1 x\n");
    assert_eq!(fs::read(dest.join("abs/file")).unwrap(), b"ok");
    assert_eq!(
        fs::read_link(dest.join("etc/link")).unwrap(),
        Path::new("/etc/hosts")
    );
    assert_eq!(fs::read(dest.join("etc/hosts2")).unwrap(), b"127.0.0.1 x\n");
    use std::os::unix::fs::FileTypeExt;
    let wh = fs::symlink_metadata(dest.join("gone/old")).unwrap();
    assert!(wh.file_type().is_char_device());
    assert!(!dest.join("dev/sda").exists());
    assert_eq!(stats.skipped_devices, 1);
    let mut buf = [0u8; 4];
    let c = std::ffi::CString::new(dest.join("opaque").as_os_str().as_bytes()).unwrap();
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            buf.as_mut_ptr().cast(),
            4,
        )
    };
    assert_eq!(n, 1);
}

#[test]
fn hostile_entries_write_nothing_outside() {
    let t = temp();
    let outside = t.0.join("outside");
    fs::create_dir_all(&outside).unwrap();
    let cases: Vec<(&str, Vec<E>)> = vec![
        ("dotdot", vec![E::File("../outside/pwned", b"x")]),
        (
            "through symlink",
            vec![
                E::Symlink("evil", "../outside"),
                E::File("evil/pwned", b"x"),
            ],
        ),
        (
            "absolute symlink",
            vec![E::Symlink("evil", "/"), E::File("evil/tmp/pwned", b"x")],
        ),
        ("hardlink out", vec![E::Hardlink("h", "../outside/secret")]),
        (
            "hardlink via symlink",
            vec![E::Symlink("s", "/etc"), E::Hardlink("h", "s/passwd")],
        ),
        ("whiteout of the parent", vec![E::File(".wh...", b"")]),
        ("whiteout of itself", vec![E::File("sub/.wh..", b"")]),
    ];
    fs::write(outside.join("secret"), b"s").unwrap();
    for (name, entries) in cases {
        let dir = t.0.join(name.replace(' ', "-"));
        fs::create_dir_all(&dir).unwrap();
        let blob = layer(&dir, &entries);
        let err = unpack(&blob, &dir.join("out"), Limits::default());
        assert!(
            matches!(err, Err(UnpackError::Hostile { .. })),
            "{name}: {err:?}"
        );
        assert!(blob.exists(), "{name}: the layer's own parent was emptied");
    }
    let names: Vec<_> = fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("secret")]);
}

#[test]
fn limits() {
    let t = temp();
    let blob = layer(&t.0, &[E::File("a", &[0; 2000]), E::File("b", b"1")]);
    let small = Limits {
        max_bytes: 1000,
        max_entries: 10,
        ..Limits::default()
    };
    assert!(matches!(
        unpack(&blob, &t.0.join("o1"), small),
        Err(UnpackError::TooLarge { .. })
    ));
    let few = Limits {
        max_bytes: 1 << 20,
        max_entries: 1,
        ..Limits::default()
    };
    assert!(matches!(
        unpack(&blob, &t.0.join("o2"), few),
        Err(UnpackError::TooManyEntries { .. })
    ));
}

/// containerd's CVE-2021-32760 class: a directory's mode, applied at
/// the end, must not land on what a later entry put at its path.
#[test]
fn a_directory_replaced_by_a_symlink_keeps_its_mode_to_itself() {
    let t = temp();
    let host_file = t.0.join("host-file");
    fs::write(&host_file, "x").unwrap();
    fs::set_permissions(&host_file, fs::Permissions::from_mode(0o600)).unwrap();
    let host = host_file.to_str().unwrap();
    let blob = layer(
        &t.0,
        &[
            E::DirMode("x/", 0o4777),
            E::Symlink("x", host),
            E::DirMode("d/", 0o755),
            E::DirMode("d/inner/", 0o4777),
            E::Symlink("d", &t.0.to_string_lossy()),
        ],
    );
    unpack(&blob, &t.0.join("out"), Limits::default()).unwrap();
    let mode = fs::metadata(&host_file).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600);
    let mode = fs::metadata(&t.0).unwrap().permissions().mode() & 0o7777;
    assert_ne!(mode, 0o4777);
}

#[test]
fn long_names_and_pax_headers_are_capped_and_counted() {
    let t = temp();
    // Claims 1 GiB: refused before its body is read (the tar reader
    // buffered such bodies whole).
    let blob = layer(&t.0, &[E::LongName(1 << 30, &[b'a'; 4096])]);
    let err = unpack(&blob, &t.0.join("huge"), Limits::default()).unwrap_err();
    assert!(matches!(err, UnpackError::Hostile { .. }), "{err}");
    // Within the cap, but past what the layer may decompress to.
    let blob = layer(
        &t.0,
        &[E::LongName(60_000, &[b'a'; 60_000]), E::File("f", b"")],
    );
    let small = Limits {
        max_bytes: 1000,
        max_entries: 10,
        ..Limits::default()
    };
    let err = unpack(&blob, &t.0.join("small"), small).unwrap_err();
    assert!(matches!(err, UnpackError::TooLarge { .. }), "{err}");

    // What the reader now does itself still works: GNU long names and
    // links, PAX paths, owners and link paths.
    let long = format!("{}/file", "d".repeat(200));
    let mut builder = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(2);
    h.set_mode(0o644);
    builder.append_data(&mut h, &long, &b"ok"[..]).unwrap();
    builder
        .append_pax_extensions([
            ("path", "pax/named".as_bytes()),
            ("uid", b"4242"),
            ("size", b"3"),
        ])
        .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path("short").unwrap();
    h.set_size(3);
    h.set_mode(0o644);
    h.set_cksum();
    builder.append(&h, &b"pax"[..]).unwrap();
    let target = format!("{}/target", "t".repeat(200));
    builder
        .append_pax_extensions([("linkpath", target.as_bytes())])
        .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path("link").unwrap();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_cksum();
    builder.append(&h, &b""[..]).unwrap();
    let blob = t.0.join("names.tar");
    fs::write(&blob, builder.into_inner().unwrap()).unwrap();
    let out = t.0.join("names");
    unpack(&blob, &out, Limits::default()).unwrap();
    assert_eq!(fs::read_to_string(out.join(&long)).unwrap(), "ok");
    assert_eq!(fs::read_to_string(out.join("pax/named")).unwrap(), "pax");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(out.join("pax/named")).unwrap().uid(), 4242);
    assert!(!out.join("short").exists());
    assert_eq!(fs::read_link(out.join("link")).unwrap(), Path::new(&target));
}

#[test]
fn layer_contents_policy() {
    let t = temp();
    let blob = layer(
        &t.0,
        &[E::Fifo("pipe"), E::Setuid("bin/su"), E::Char("dev/mem")],
    );
    let stats = unpack(&blob, &t.0.join("default"), Limits::default()).unwrap();
    assert_eq!(stats.skipped_devices, 1);
    let mode = |p: &str| {
        use std::os::unix::fs::MetadataExt;
        fs::symlink_metadata(t.0.join(p)).unwrap().mode()
    };
    assert_eq!(mode("default/pipe") & libc::S_IFMT, libc::S_IFIFO);
    assert_eq!(mode("default/bin/su") & 0o7777, 0o4755);
    assert!(!t.0.join("default/dev/mem").exists());

    let strict = |contents: Contents| Limits {
        contents,
        ..Limits::default()
    };
    let stripped = Contents {
        setuid: false,
        ..Contents::default()
    };
    unpack(&blob, &t.0.join("stripped"), strict(stripped)).unwrap();
    assert_eq!(mode("stripped/bin/su") & 0o7777, 0o755);
    for (name, contents, reason) in [
        (
            "no-fifos",
            Contents {
                fifos: false,
                ..Contents::default()
            },
            "FIFO",
        ),
        (
            "no-devices",
            Contents {
                refuse_devices: true,
                ..Contents::default()
            },
            "device node",
        ),
    ] {
        let err = unpack(&blob, &t.0.join(name), strict(contents)).unwrap_err();
        assert!(err.to_string().contains(reason), "{name}: {err}");
    }
}
