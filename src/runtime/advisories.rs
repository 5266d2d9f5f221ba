//! Container escapes fixed in the OCI runtimes after versions that are
//! still shipped: nanolet cannot fix the runtime, but says at start and in
//! `nanolet check` which of them the node's runtime predates, and refuses
//! the specs it can tell are the trigger (paths through /proc/self).
//!
//! By the upstream version the runtime prints: a distribution that
//! backported a fix (Debian's 1.1.5+ds1-1+deb12u1 carries CVE-2024-21626's)
//! is still named, with that caveat in the message.

use crate::config::RuntimeKind;

/// A version as runc prints it: `1.1.5+ds1`, `1.0.0-rc6`, `1.4.0-rc.2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Version {
    major: u32,
    minor: u32,
    patch: u32,
    /// A release candidate sorts before its release: `None` is the release.
    rc: ReleaseCandidate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ReleaseCandidate {
    Rc(u32),
    Release,
}

fn parse(text: &str) -> Option<Version> {
    let text = text.trim().trim_start_matches('v');
    let text = text.split('+').next()?;
    let (release, pre) = match text.split_once('-') {
        Some((release, pre)) => (release, Some(pre)),
        None => (text, None),
    };
    let mut numbers = release.split('.').map(|n| n.parse::<u32>().ok());
    let major = numbers.next()??;
    let minor = numbers.next().flatten().unwrap_or(0);
    let patch = numbers.next().flatten().unwrap_or(0);
    let rc = match pre {
        None => ReleaseCandidate::Release,
        Some(pre) => {
            let digits = pre.trim_start_matches("rc").trim_start_matches('.');
            ReleaseCandidate::Rc(digits.parse().ok()?)
        }
    };
    Some(Version {
        major,
        minor,
        patch,
        rc,
    })
}

const fn release(major: u32, minor: u32, patch: u32) -> Version {
    Version {
        major,
        minor,
        patch,
        rc: ReleaseCandidate::Release,
    }
}

struct Advisory {
    ids: &'static str,
    what: &'static str,
    /// Fixed from each of these on its own minor line; a version on a
    /// line with no entry is fixed if past the newest.
    fixed: &'static [Version],
    /// The first version of the newest line, or none: versions at or past
    /// it are fixed (pre-releases of a fixed line count as affected).
    fixed_line_from: Option<Version>,
}

const RUNC: &[Advisory] = &[
    Advisory {
        ids: "CVE-2019-5736",
        what: "a container overwrites the host's runc binary",
        fixed: &[Version {
            major: 1,
            minor: 0,
            patch: 0,
            rc: ReleaseCandidate::Rc(7),
        }],
        fixed_line_from: None,
    },
    Advisory {
        ids: "CVE-2024-21626",
        what: "a workingDir through /proc/self/fd reaches the host's filesystem",
        fixed: &[release(1, 1, 12)],
        fixed_line_from: None,
    },
    Advisory {
        ids: "CVE-2025-31133, CVE-2025-52565, CVE-2025-52881",
        what: "an image's /dev/null or /dev/console link, or a racing mount, redirects runc's writes to /proc",
        fixed: &[release(1, 2, 8), release(1, 3, 3)],
        fixed_line_from: Some(Version {
            major: 1,
            minor: 4,
            patch: 0,
            rc: ReleaseCandidate::Rc(3),
        }),
    },
];

impl Advisory {
    fn affects(&self, v: Version) -> bool {
        if self.fixed_line_from.is_some_and(|from| v >= from) {
            return false;
        }
        // The fix of v's own minor line, else the first fix above it.
        match self
            .fixed
            .iter()
            .find(|f| (f.major, f.minor) == (v.major, v.minor))
        {
            Some(fix) => v < *fix,
            None => match self.fixed.iter().find(|f| **f > v) {
                Some(_) => true,
                None => self.fixed_line_from.is_some(),
            },
        }
    }
}

/// What the runtime's version predates, a line each; empty when nothing
/// is known (crun's own advisories are not tracked here, nor a version
/// that does not parse).
pub fn known_escapes(kind: RuntimeKind, version: &str) -> Vec<String> {
    let (RuntimeKind::Runc, Some(v)) = (kind, parse(version)) else {
        return Vec::new();
    };
    RUNC.iter()
        .filter(|a| a.affects(v))
        .map(|a| {
            format!(
                "runc {version} predates the fix of {} ({}), unless the distribution backported it",
                a.ids, a.what
            )
        })
        .collect()
}

/// What nanolet needs of runc that an older one lacks.
pub struct Shortfall {
    /// Pods run wrong with it, not merely without an extra.
    pub breaks_pods: bool,
    pub text: String,
}

/// Full cgroup v2 support, `linux.resources.unified` among it: an older
/// runc ignores the field (Go's JSON drops unknown keys), so containers on
/// cgroup v2 would run without the CPU weight of their requests.
const RUNC_CGROUP_V2: Version = Version {
    major: 1,
    minor: 0,
    patch: 0,
    rc: ReleaseCandidate::Rc(93),
};

/// `runc features`, which tells nanolet the runtime can make recursively
/// read-only mounts.
const RUNC_FEATURES: Version = release(1, 1, 0);

/// What the node's runtime is too old for; empty when nothing is known
/// (crun's history is not tracked here, nor a version that does not parse).
pub fn too_old(kind: RuntimeKind, version: &str, cgroup_v2: bool) -> Vec<Shortfall> {
    let (RuntimeKind::Runc, Some(v)) = (kind, parse(version)) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    if cgroup_v2 && v < RUNC_CGROUP_V2 {
        found.push(Shortfall {
            breaks_pods: true,
            text: format!(
                "runc {version} is too old for cgroup v2 (1.0.0-rc93 and later support it fully): it ignores linux.resources.unified, so containers get no CPU weight from their requests; install runc 1.1 or later"
            ),
        });
    }
    if v < RUNC_FEATURES {
        found.push(Shortfall {
            breaks_pods: false,
            text: format!(
                "runc {version} has no `features` command (runc 1.1): read-only volumes cannot be made recursively read-only, and pods asking for recursiveReadOnly: Enabled fail to start"
            ),
        });
    }
    found
}

/// Whether `path` in a container goes through /proc/self, /proc/thread-self
/// or a /proc/<pid>: as a workingDir or a mount target such a path
/// reaches the runtime's own open files (CVE-2024-21626's trigger).
pub fn through_proc_self(path: &str) -> bool {
    let mut parts = path.split('/').filter(|p| !p.is_empty() && *p != ".");
    parts.next() == Some("proc")
        && parts.next().is_some_and(|p| {
            p == "self" || p == "thread-self" || p.bytes().all(|b| b.is_ascii_digit())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(version: &str) -> Vec<&'static str> {
        let v = parse(version).unwrap();
        RUNC.iter()
            .filter(|a| a.affects(v))
            .map(|a| a.ids)
            .collect()
    }

    #[test]
    fn runc_versions_against_their_fixes() {
        const ALL: [&str; 3] = [
            "CVE-2019-5736",
            "CVE-2024-21626",
            "CVE-2025-31133, CVE-2025-52565, CVE-2025-52881",
        ];
        assert_eq!(ids("1.0.0-rc6"), ALL);
        assert_eq!(ids("1.0.0-rc7"), ALL[1..]);
        assert_eq!(ids("1.1.5+ds1"), ALL[1..]);
        assert_eq!(ids("1.1.12"), ALL[2..]);
        assert_eq!(ids("1.2.7"), ALL[2..]);
        assert!(ids("1.2.8").is_empty());
        assert_eq!(ids("1.3.2"), ALL[2..]);
        assert!(ids("1.3.3").is_empty());
        assert_eq!(ids("1.4.0-rc.2"), ALL[2..]);
        assert!(ids("1.4.0-rc.3").is_empty());
        assert!(ids("1.4.1").is_empty());
        assert!(known_escapes(RuntimeKind::Runc, "unknown").is_empty());
        assert!(known_escapes(RuntimeKind::Crun, "1.8.1").is_empty());
        let lines = known_escapes(RuntimeKind::Runc, "1.1.5");
        assert_eq!(lines.len(), 2);
        assert!(lines[0].contains("CVE-2024-21626"), "{lines:?}");
    }

    #[test]
    fn runc_too_old_for_what_nanolet_writes() {
        let breaks = |version: &str, v2: bool| -> Vec<bool> {
            too_old(RuntimeKind::Runc, version, v2)
                .iter()
                .map(|s| s.breaks_pods)
                .collect()
        };
        assert_eq!(breaks("1.0.0-rc92", true), [true, false]);
        assert_eq!(breaks("1.0.0-rc92", false), [false]);
        assert_eq!(breaks("1.0.0-rc93", true), [false]);
        assert_eq!(breaks("1.0.3", true), [false]);
        assert!(breaks("1.1.0", true).is_empty());
        assert!(breaks("1.1.5+ds1", true).is_empty());
        assert!(breaks("1.1.0-rc.1", true).len() == 1);
        assert!(too_old(RuntimeKind::Crun, "0.1", true).is_empty());
        assert!(too_old(RuntimeKind::Runc, "unknown", true).is_empty());
        let text = &too_old(RuntimeKind::Runc, "1.0.0-rc92", true)[0].text;
        assert!(text.contains("linux.resources.unified"), "{text}");
    }

    #[test]
    fn paths_through_proc_self() {
        for path in [
            "/proc/self/fd/8",
            "/proc//self/cwd",
            "/./proc/thread-self/fd/7",
            "/proc/1/root",
        ] {
            assert!(through_proc_self(path), "{path}");
        }
        for path in ["/", "/app", "/proc", "/proc/sys/net", "/data/proc/self"] {
            assert!(!through_proc_self(path), "{path}");
        }
    }
}
