//! A finding of `doctor`: which check, how bad, what was found and what to
//! do.

use serde::Serialize;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Severity {
    /// The check passed.
    Ok,
    /// Worth knowing; nothing to fix.
    Note,
    /// Needs a look, but outboxd works.
    Warning,
    /// outboxd cannot work correctly until it is fixed.
    Error,
}

impl Severity {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Note => "note",
            Severity::Warning => "warning",
            Severity::Error => "ERROR",
        }
    }
}

/// The result of one check.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Finding {
    /// Which check ("integrity", "journal-mode"…).
    pub(crate) check: &'static str,
    pub(crate) severity: Severity,
    /// What was found.
    pub(crate) message: String,
    /// What to do about it, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) action: Option<String>,
}

impl Finding {
    pub(crate) fn new(
        check: &'static str,
        severity: Severity,
        message: impl Into<String>,
    ) -> Finding {
        Finding {
            check,
            severity,
            message: message.into(),
            action: None,
        }
    }

    pub(crate) fn action(mut self, action: impl Into<String>) -> Finding {
        self.action = Some(action.into());
        self
    }

    pub(crate) fn ok(check: &'static str, message: impl Into<String>) -> Finding {
        Finding::new(check, Severity::Ok, message)
    }

    /// A check that could not run: an error, since nothing is known.
    pub(crate) fn failed(check: &'static str, what: &str, e: impl std::fmt::Display) -> Finding {
        Finding::new(check, Severity::Error, format!("cannot {what}: {e}")).action(
            "run `outboxd doctor` again; if this persists, the file may be damaged \
             (see the integrity finding)",
        )
    }
}
