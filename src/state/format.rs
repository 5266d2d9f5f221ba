//! The state dir's format version, in `<stateDir>/format`. A board's agent
//! is replaced under running pods: the new agent must read what the old
//! one wrote (migrating it where the layout changed), and an old agent put
//! back over a newer state dir must refuse it without touching anything,
//! since it could not tell what it would break.
//!
//! Format 0 is every state dir made before the version was recorded: it
//! has no `format` file. Format 1 is its layout with the file.

use std::io;
use std::path::{Path, PathBuf};

use super::{Durability, Layout, write_atomic};

/// The format this agent writes.
pub const CURRENT: u32 = 1;

const FILE: &str = "format";

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {text:?} is not a state dir format version")]
    Invalid { path: PathBuf, text: String },
    #[error(
        "{path}: the state dir is in format {found}, written by a newer nanolet; this one ({}) knows formats up to {CURRENT} and leaves the state dir as it is: run the newer nanolet again, or give this one another --state-dir",
        env!("CARGO_PKG_VERSION")
    )]
    Newer { path: PathBuf, found: u32 },
    #[error(transparent)]
    Write(#[from] super::StateError),
}

/// What [`prepare`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    /// A new state dir, now marked with the current format.
    New,
    /// In the current format already.
    Current,
    /// Migrated from this older format to the current one.
    Migrated { from: u32 },
}

/// The state dir's format, read before the agent writes anything there:
/// an older one is migrated and marked current, a newer one refused.
pub fn prepare(layout: &Layout) -> Result<Prepared, FormatError> {
    let path = layout.root.join(FILE);
    let found = match read(&path)? {
        Some(format) => format,
        // A state dir of format 0 has pods (or images); a new one nothing.
        None if has_state(layout) => 0,
        None => {
            mark_current(&path)?;
            return Ok(Prepared::New);
        }
    };
    if found > CURRENT {
        return Err(FormatError::Newer { path, found });
    }
    if found == CURRENT {
        return Ok(Prepared::Current);
    }
    // The steps from `found` to the current format go here, each moving
    // what its format changed. Format 1 changed nothing but this file.
    mark_current(&path)?;
    Ok(Prepared::Migrated { from: found })
}

fn read(path: &Path) -> Result<Option<u32>, FormatError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(FormatError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    text.trim()
        .parse()
        .map(Some)
        .map_err(|_| FormatError::Invalid {
            path: path.to_owned(),
            text: text.chars().take(64).collect(),
        })
}

fn has_state(layout: &Layout) -> bool {
    [layout.pods(), layout.images()].iter().any(|dir| {
        std::fs::read_dir(dir)
            .map(|mut entries| entries.next().is_some())
            .unwrap_or(false)
    })
}

fn mark_current(path: &Path) -> Result<(), FormatError> {
    write_atomic(
        path,
        format!("{CURRENT}\n").as_bytes(),
        0o644,
        Durability::PowerLoss,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> (crate::state::TestDir, Layout) {
        let dir = crate::state::TestDir::new("format");
        let layout = Layout::new(&dir.0);
        (dir, layout)
    }

    #[test]
    fn a_new_state_dir_is_marked_current() {
        let (_dir, layout) = layout();
        assert_eq!(prepare(&layout).unwrap(), Prepared::New);
        let text = std::fs::read_to_string(layout.root.join(FILE)).unwrap();
        assert_eq!(text, format!("{CURRENT}\n"));
        assert_eq!(prepare(&layout).unwrap(), Prepared::Current);
    }

    #[test]
    fn a_state_dir_with_pods_and_no_format_file_is_format_0_and_migrated() {
        let (_dir, layout) = layout();
        std::fs::create_dir_all(layout.pod("uid-1")).unwrap();
        assert_eq!(prepare(&layout).unwrap(), Prepared::Migrated { from: 0 });
        assert_eq!(prepare(&layout).unwrap(), Prepared::Current);
    }

    #[test]
    fn a_newer_format_is_refused_and_left_untouched() {
        let (_dir, layout) = layout();
        std::fs::create_dir_all(layout.pod("uid-1")).unwrap();
        let path = layout.root.join(FILE);
        std::fs::write(&path, format!("{}\n", CURRENT + 1)).unwrap();
        let err = prepare(&layout).unwrap_err();
        assert!(matches!(err, FormatError::Newer { found, .. } if found == CURRENT + 1));
        assert!(err.to_string().contains("newer nanolet"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{}\n", CURRENT + 1)
        );
    }

    #[test]
    fn a_format_file_that_is_not_a_number_is_an_error_naming_it() {
        let (_dir, layout) = layout();
        let path = layout.root.join(FILE);
        std::fs::write(&path, "one\n").unwrap();
        let err = prepare(&layout).unwrap_err();
        assert!(err.to_string().contains("\"one\\n\""), "{err}");
        std::fs::write(&path, "99999999999999999999").unwrap();
        assert!(matches!(prepare(&layout), Err(FormatError::Invalid { .. })));
    }
}
