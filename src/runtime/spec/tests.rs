use super::*;
use crate::pod::manifest::parse_one;

fn pod(containers: &str) -> Pod {
    let text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers: {containers}\n"
    );
    parse_one(&text)
}

/// Mounts a tmpfs (needs root, as the bundle tests do).
#[test]
fn bind_mounts_keep_the_flags_a_user_namespace_cannot_clear() {
    use nix::mount::MsFlags;
    let dir = crate::state::TestDir::new("locked-flags");
    crate::mount::tmpfs(&dir.0).unwrap();
    let mut volume = bind("/v", &dir.0, false);
    keep_locked_flags(&mut volume);
    for option in ["nosuid", "nodev", "rw"] {
        assert!(volume.options.iter().any(|o| o == option), "{volume:?}");
    }
    assert!(!volume.options.iter().any(|o| o == "noexec"), "{volume:?}");
    nix::mount::mount(
        None::<&str>,
        &dir.0,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .unwrap();
    let mut volume = bind("/v", &dir.0, false);
    keep_locked_flags(&mut volume);
    assert!(volume.options.iter().any(|o| o == "ro"), "{volume:?}");
    assert!(!volume.options.iter().any(|o| o == "rw"), "{volume:?}");
}

fn image(entrypoint: &[&str], cmd: &[&str]) -> RunConfig {
    let v = |s: &[&str]| (!s.is_empty()).then(|| s.iter().map(|x| x.to_string()).collect());
    RunConfig {
        entrypoint: v(entrypoint),
        cmd: v(cmd),
        ..Default::default()
    }
}

#[test]
fn command_and_args_follow_kubernetes_rules() {
    let p = pod("[{name: a, image: x:1}]");
    let c = &p.containers[0];
    assert_eq!(
        process_args(c, &image(&["/ep"], &["cmd"]), &[]).unwrap(),
        vec!["/ep", "cmd"]
    );
    let p = pod("[{name: a, image: x:1, args: [x]}]");
    assert_eq!(
        process_args(&p.containers[0], &image(&["/ep"], &["cmd"]), &[]).unwrap(),
        vec!["/ep", "x"]
    );
    let p = pod("[{name: a, image: x:1, command: [sh], args: [-c, 'true']}]");
    assert_eq!(
        process_args(&p.containers[0], &image(&["/ep"], &["cmd"]), &[]).unwrap(),
        vec!["sh", "-c", "true"]
    );
    let p = pod("[{name: a, image: x:1}]");
    assert_eq!(
        process_args(&p.containers[0], &image(&[], &[]), &[]),
        Err(SpecError::NoCommand)
    );
}

#[test]
fn env_precedence() {
    let p = pod("[{name: a, image: x:1, env: [{name: A, value: pod}, {name: PATH, value: /p}]}]");
    let img = RunConfig {
        env: Some(vec!["A=image".into(), "B=image".into()]),
        ..Default::default()
    };
    let resolved = crate::pod::env::resolve(
        &p,
        &p.containers[0],
        &Default::default(),
        &Default::default(),
    )
    .unwrap();
    let env = environment(&p.hostname, &resolved, &img, false);
    assert!(env.contains(&"A=pod".to_string()));
    assert!(env.contains(&"B=image".to_string()));
    assert!(env.contains(&"PATH=/p".to_string()));
    assert!(env.contains(&"HOSTNAME=p".to_string()));
    assert!(!env.iter().any(|e| e.starts_with("TERM=")));
    let on_terminal = environment(&p.hostname, &resolved, &img, true);
    assert!(on_terminal.contains(&"TERM=xterm".to_string()));
}

#[test]
fn users() {
    let guard = crate::state::TestDir::new("spec");
    let dir = guard.0.clone();
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(
        dir.join("etc/passwd"),
        "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(dir.join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
    let p = pod("[{name: a, image: x:1}]");
    let c = &p.containers[0];
    let with_user = |u: &str| RunConfig {
        user: Some(u.into()),
        ..Default::default()
    };
    assert_eq!(resolve_user(&p, c, &with_user(""), &dir).unwrap().uid, 0);
    let u = resolve_user(&p, c, &with_user("app"), &dir).unwrap();
    assert_eq!((u.uid, u.gid), (1000, 1001));
    let u = resolve_user(&p, c, &with_user("app:staff"), &dir).unwrap();
    assert_eq!((u.uid, u.gid), (1000, 50));
    let u = resolve_user(&p, c, &with_user("4242"), &dir).unwrap();
    assert_eq!((u.uid, u.gid), (4242, 0));
    assert!(resolve_user(&p, c, &with_user("nobody"), &dir).is_err());
    let nonroot = pod("[{name: a, image: x:1, securityContext: {runAsNonRoot: true}}]");
    assert_eq!(
        resolve_user(&nonroot, &nonroot.containers[0], &with_user(""), &dir),
        Err(SpecError::RunsAsRoot)
    );
    let explicit = pod("[{name: a, image: x:1, securityContext: {runAsUser: 1000}}]");
    let u = resolve_user(&explicit, &explicit.containers[0], &with_user(""), &dir).unwrap();
    assert_eq!((u.uid, u.gid), (1000, 1001));
}

/// supplementalGroupsPolicy: Merge (the default) adds the groups the
/// image's /etc/group makes its user a member of; Strict does not.
#[test]
fn image_groups_merge_unless_strict() {
    let guard = crate::state::TestDir::new("spec");
    let dir = guard.0.clone();
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(
        dir.join("etc/passwd"),
        "app:x:1000:1000::/:/bin/sh
",
    )
    .unwrap();
    std::fs::write(
        dir.join("etc/group"),
        "app:x:1000:\naudio:x:29:pi,app\nvideo:x:44:pi\nstaff:x:50:app\n",
    )
    .unwrap();
    let app = RunConfig {
        user: Some("app".into()),
        ..Default::default()
    };
    let merged = pod("[{name: a, image: x:1}]");
    let u = resolve_user(&merged, &merged.containers[0], &app, &dir).unwrap();
    assert_eq!(u.additional_gids, vec![29, 50]);
    let strict = crate::pod::manifest::parse_one(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  securityContext: {supplementalGroupsPolicy: Strict, supplementalGroups: [7, 7], fsGroup: 8}\n  containers: [{name: a, image: x:1}]\n",
    );
    let u = resolve_user(&strict, &strict.containers[0], &app, &dir).unwrap();
    assert_eq!(u.additional_gids, vec![7, 8]);
}

/// An image whose /etc/passwd is a link to /dev/zero grew the agent
/// to 24 GB (read with the host's resolution); a FIFO there blocked the
/// loop. Both resolve inside the rootfs and are refused as not files.
#[test]
fn hostile_user_databases_are_refused_not_followed() {
    let guard = crate::state::TestDir::new("spec");
    let dir = guard.0.clone();
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::create_dir_all(dir.join("dev")).unwrap();
    nix::unistd::mkfifo(
        &dir.join("dev/zero"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("etc/passwd")).unwrap();
    nix::unistd::mkfifo(
        &dir.join("etc/group"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let p = pod("[{name: a, image: x:1}]");
    let c = &p.containers[0];
    let app = RunConfig {
        user: Some("app".into()),
        ..Default::default()
    };
    let e = resolve_user(&p, c, &app, &dir).unwrap_err();
    assert!(
        matches!(&e, SpecError::ImageFile(m) if m.contains("not a regular file")),
        "{e}"
    );
    std::fs::remove_file(dir.join("etc/passwd")).unwrap();
    std::fs::remove_file(dir.join("etc/group")).unwrap();
    std::fs::write(
        dir.join("big"),
        vec![b'#'; (MAX_USER_DATABASE + 1) as usize],
    )
    .unwrap();
    std::os::unix::fs::symlink("../../../big", dir.join("etc/passwd")).unwrap();
    let e = resolve_user(&p, c, &app, &dir).unwrap_err();
    assert!(
        matches!(&e, SpecError::ImageFile(m) if m.contains("larger than")),
        "{e}"
    );
}
