//! Finding the program a command sink runs, once, when the sink is built:
//! a path is checked, a bare name is looked up in `PATH`, and a program
//! given with its arguments in one string is named as such.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

use super::CommandError;

pub(super) fn resolve_program(program: &OsStr) -> Result<PathBuf, CommandError> {
    let err = match resolve_one(program) {
        Err(err @ (CommandError::NotFound { .. } | CommandError::NotInPath { .. })) => err,
        other => return other,
    };
    // "/bin/echo hello": a program and its arguments in one string. Say so
    // when the first word is a program, rather than "does not exist".
    let words: Vec<&str> = program.to_str().unwrap_or("").split_whitespace().collect();
    if let [first, rest @ ..] = words.as_slice() {
        if !rest.is_empty() && resolve_one(OsStr::new(first)).is_ok() {
            return Err(CommandError::WithArguments {
                given: program.to_string_lossy().into_owned(),
                program: first.to_string(),
                args: rest.iter().map(|a| a.to_string()).collect(),
            });
        }
    }
    Err(err)
}

fn resolve_one(program: &OsStr) -> Result<PathBuf, CommandError> {
    if program.is_empty() {
        return Err(CommandError::EmptyProgram);
    }
    let given = Path::new(program);
    let absolute = |path: &Path| {
        std::path::absolute(path).map_err(|source| CommandError::Inspect {
            path: path.to_path_buf(),
            source,
        })
    };
    if program.as_encoded_bytes().contains(&b'/') {
        let path = absolute(given)?;
        check_executable(&path)?;
        return Ok(path);
    }
    match which::which(given) {
        Ok(found) => absolute(&found),
        Err(_) => Err(CommandError::NotInPath {
            name: program.to_string_lossy().into_owned(),
            path_var: std::env::var_os("PATH")
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
        }),
    }
}

fn check_executable(path: &Path) -> Result<(), CommandError> {
    let meta = std::fs::metadata(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => CommandError::NotFound {
            path: path.to_path_buf(),
        },
        _ => CommandError::Inspect {
            path: path.to_path_buf(),
            source,
        },
    })?;
    if !meta.is_file() {
        return Err(CommandError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    // access(2) rather than the mode bits: it answers for this user, its
    // groups and ACLs, as the exec will.
    #[cfg(unix)]
    if rustix::fs::access(path, rustix::fs::Access::EXEC_OK).is_err() {
        return Err(CommandError::NotExecutable {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}
