//! `/dead`, and its actions: confirm, then apply.

use anyhow::{Context, Result};
use outboxd::dead_letter::{self, Selector};
use outboxd::inspect;
use outboxd::Timestamp;

use super::notice::Notice;
use super::Visit;
use super::{ctx, nothing_done, page, parse_pattern};
use crate::console::form::Params;
use crate::console::pages::{self, ConfirmDeadView, DeadView, Nav};
use crate::console::server::{Request, Response};

pub(super) fn dead(app: &Visit, req: &Request) -> Result<Response> {
    let q = req.query_pairs();
    let pattern_text = q.get("type").unwrap_or("").to_string();
    let (pattern, error) = match q.get("type").map(parse_pattern).transpose() {
        Ok(p) => (p, None),
        Err(e) => (None, Some(e)),
    };
    let after = match (q.get("at"), q.get("before")) {
        (Some(at), Some(id)) => at.parse().ok().zip(id.parse().ok()),
        _ => None,
    };
    let done = Notice::from_query(app, &q).map(|n| n.text());
    let conn = app.pool.get()?;
    let total = outboxd::status::dead_count(&conn)?;
    let rows = if error.is_none() {
        inspect::dead_page(&conn, pattern.as_ref(), after)?
    } else {
        inspect::DeadPage::default()
    };
    let view = DeadView {
        pattern: pattern_text,
        error,
        done,
        total,
        page: rows,
    };
    let body = pages::dead(&ctx(app), &view);
    Ok(page(app, 200, "Dead letters", Nav::Dead, body))
}

/// A dead-letter action read from a form: (verb, op, what it covers,
/// selectors, the row ids given, the pattern given).
struct DeadAction {
    requeue: bool,
    op: String,
    what: String,
    selectors: Vec<Selector>,
    ids: Vec<String>,
    pattern: String,
}

fn dead_action(form: &Params) -> std::result::Result<DeadAction, String> {
    let op = form.get("op").unwrap_or("").to_string();
    let (verb, scope) = op.split_once(':').ok_or("no action was chosen")?;
    let (verb, scope) = (verb.to_string(), scope.to_string());
    let requeue = match verb.as_str() {
        "requeue" => true,
        "discard" => false,
        _ => return Err(format!("{verb:?} is not an action")),
    };
    let pattern = form.get("type").unwrap_or("").to_string();
    let ids: Vec<String> = form.all("id").into_iter().map(str::to_string).collect();
    let (what, selectors) = match scope.as_str() {
        "selected" => {
            if ids.is_empty() {
                return Err("no dead letter was selected; tick the rows first".into());
            }
            for id in &ids {
                id.parse::<i64>()
                    .map_err(|_| format!("{id:?} is not a row id"))?;
            }
            (
                "the selected rows".to_string(),
                ids.iter().map(|id| Selector::One(id.clone())).collect(),
            )
        }
        "type" => (
            format!("every one of type {pattern}"),
            vec![Selector::Type(parse_pattern(&pattern)?)],
        ),
        "all" => ("all of them".to_string(), vec![Selector::All]),
        _ => return Err(format!("{scope:?} is not a choice of rows")),
    };
    Ok(DeadAction {
        requeue,
        op,
        what,
        selectors,
        ids: if scope == "selected" { ids } else { Vec::new() },
        pattern,
    })
}

pub(super) fn dead_confirm(app: &Visit, form: &Params) -> Result<Response> {
    let action = match dead_action(form) {
        Ok(a) => a,
        Err(e) => return Ok(nothing_done(app, Nav::Dead, &e)),
    };
    let conn = app.pool.get()?;
    let mut count = 0;
    for s in &action.selectors {
        count += dead_letter::count(&conn, s)?;
    }
    let verb = if action.requeue { "Requeue" } else { "Discard" };
    let view = ConfirmDeadView {
        verb,
        op: action.op,
        what: action.what,
        count,
        ids: action.ids,
        pattern: action.pattern,
    };
    let body = pages::confirm_dead(&ctx(app), &view);
    Ok(page(app, 200, "Confirm", Nav::Dead, body))
}

pub(super) fn dead_apply(app: &Visit, form: &Params) -> Result<Response> {
    let action = match dead_action(form) {
        Ok(a) => a,
        Err(e) => return Ok(nothing_done(app, Nav::Dead, &e)),
    };
    let mut conn = crate::cmd::database::for_writing(&app.db)?;
    let mut changed = 0;
    for s in &action.selectors {
        let n = if action.requeue {
            dead_letter::requeue(&mut conn, s, Timestamp::now())
        } else {
            dead_letter::discard(&mut conn, s)
        };
        changed += match n {
            Ok(n) => n,
            // A selected row requeued or discarded meanwhile.
            Err(outboxd::Error::NotFound { .. }) => 0,
            Err(e) => return Err(e).context("cannot change the dead letters"),
        };
    }
    let notice = if action.requeue {
        Notice::Requeued(changed)
    } else {
        Notice::Discarded(changed)
    };
    tracing::info!(
        changed,
        action = notice.verb(),
        "dead letters changed from the console"
    );
    Ok(notice.redirect(app, "/dead"))
}
