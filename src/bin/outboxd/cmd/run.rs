//! `outboxd run`: the relay, until SIGINT or SIGTERM.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::RecvTimeoutError;

use super::config_arg::ConfigArg;
use super::database::{self, FileIdentity};
use super::Global;
use crate::args::parse_duration;
use crate::config::{alerts, resolve_listen, Config};
use crate::exit::{Exit, Failure};
use outboxd::health::Thresholds;

/// Shown under `outboxd run --help`.
pub(crate) const EXAMPLES: &str = "\
Without --config, one consumer named `stdout` takes every event and writes it
as one JSON line (the envelope) to stdout; logs go to stderr. The database
(--db, OUTBOXD_DB, else ./outboxd.db) is created and migrated if needed.

With --config, the file's consumers, sinks and settings are used (see
packaging/outboxd.example.toml). --db or OUTBOXD_DB, when given, wins over
the config's `database`. Every config error is reported before any event is
claimed, with exit code 6.

The first SIGINT or SIGTERM stops claiming, lets deliveries in flight finish
within the shutdown grace (default 30s), records their outcomes, releases the
rest and exits 0; a second one exits at once with code 130. When the database
refuses to record outcomes until the grace runs out (a full disk), it says at
ERROR how many it could not record and exits 3: those events will be
delivered again. On a damaged database file (SQLITE_CORRUPT, SQLITE_NOTADB)
it stops claiming, records what it still can, logs what `outboxd doctor`
says, and exits 3. When the database file is deleted, or another file is
moved into its place, it logs an ERROR, /healthz answers 503, and it stops
as on SIGTERM and exits 3.

Examples:
  outboxd run                                   # terminal 1
  outboxd enqueue --type article.created.v1 --payload '{\"id\": 7}'   # terminal 2
  outboxd run --config /etc/outboxd/outboxd.toml --http 127.0.0.1:9464   # console at /";

/// How often the main thread checks that the relay is alive.
const LIVENESS_INTERVAL: Duration = Duration::from_millis(500);

/// How often the health verdict is checked for the alert log.
const ALERT_INTERVAL: Duration = Duration::from_secs(30);

/// Options of `outboxd run`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("config", |a| a.help(
    "The config file (outboxd.toml); without it, every event goes to stdout"
)))]
pub(crate) struct Args {
    #[command(flatten)]
    config: ConfigArg,
    /// Serve Prometheus metrics on this address (such as 127.0.0.1:9464);
    /// wins over the config's metrics.listen.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Serve the web console, /metrics and /healthz on this address (such
    /// as 127.0.0.1:9464); wins over the config's http.listen.
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// The environment variable holding the console's token (needed on an
    /// address other than loopback); wins over the config's http.token_env.
    #[arg(long, value_name = "VAR")]
    http_token_env: Option<String>,
    /// How long deliveries in flight may finish after SIGINT/SIGTERM: 500ms,
    /// 30s, 5m; wins over the config's relay.shutdown_grace [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    shutdown_grace: Option<Duration>,
}

/// Validates everything, migrates, starts the relay and waits for a signal.
pub(crate) fn exec(global: &Global, args: &Args) -> Result<Exit> {
    // The console's token variable from the command line holds a secret
    // as much as the file's `*_env` keys do.
    let token_env: Vec<&str> = args.http_token_env.as_deref().into_iter().collect();
    let (db, config) = args.config.load(global, &token_env)?;
    let config = config.unwrap_or_else(Config::stdout_default);
    crate::init_logging(&global.log, &config.log, "info");

    let grace = args.shutdown_grace.unwrap_or(config.relay.shutdown_grace);
    let metrics_addr = match &args.metrics {
        Some(a) => Some(resolve_listen(a).map_err(|m| Failure::config(format!("--metrics: {m}")))?),
        None => config.metrics,
    };
    let http = super::console::HttpServers::bind(
        &config,
        args.http.as_deref(),
        args.http_token_env.as_deref(),
        metrics_addr,
    )?;
    let signals = super::signals::install_handler()?;
    // Sinks that connect somewhere (nats) do it now, before the database is
    // touched: refused credentials or a missing stream are config errors.
    for c in &config.consumers {
        c.sink
            .start(&c.name, &c.retry, &config.relay)
            .map_err(|e| Failure::config(e.to_string()))?;
    }

    let report = database::migrate(&db)?;
    if !report.was_current() {
        tracing::info!(from = report.from, to = report.to, "migrated the database");
    }
    // After the migration (a sql sink may write outboxd's tables too),
    // before anything is claimed.
    config.check_database(&db).map_err(Failure::from)?;
    let alerts = config.alerts;
    let captures = config.captures.clone();
    let config_file = config
        .file
        .as_ref()
        .map_or("none (every event to stdout)".to_string(), |f| {
            f.display().to_string()
        });
    let consumers: Vec<String> = config
        .consumers
        .iter()
        .map(|c| {
            format!(
                "{} <- {} via {}",
                c.name,
                c.types.join(","),
                c.sink.describe()
            )
        })
        .collect();
    #[cfg(feature = "otlp")]
    let exporter = config.tracing.as_ref().map(crate::otlp::Exporter::start);
    #[cfg(feature = "otlp")]
    let spans = exporter.as_ref();
    #[cfg(not(feature = "otlp"))]
    let spans = None;
    let relay = config
        .relay_builder(&db, spans)
        .build()
        .map_err(|e| Failure::config(format!("invalid relay setting: {e}")))?
        .start()
        .with_context(|| format!("cannot start the relay on {}", db.display()))?;
    let servers = http.start(&db, relay.metrics_source())?;
    for c in &consumers {
        tracing::info!(consumer = %c, "consumer registered");
    }
    tracing::info!(database = %db.display(), config = %config_file, "outboxd running; SIGINT or SIGTERM stops it");

    let mut captures = super::capture::Watch::start(
        &db,
        &captures,
        outboxd::relay::DEFAULT_HOUSEKEEPING_INTERVAL,
    );
    // The health verdict is checked at once, then every ALERT_INTERVAL.
    let mut alert_log = AlertLog::new(&db, alerts);
    // The file the relay opened: a path that names another file, or none,
    // leaves the relay writing where nobody will read.
    let db_file = FileIdentity::of(&db)
        .with_context(|| format!("cannot look at the database file {}", db.display()))?;
    let mut failure = None;
    loop {
        match signals.recv_timeout(LIVENESS_INTERVAL) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
        if relay.is_finished() {
            relay.join().context("the relay stopped")?;
            anyhow::bail!("the relay stopped without being asked to");
        }
        if let Some(how) = db_file.gone_from(&db) {
            let message = format!(
                "the database file {} {how} while outboxd ran; the relay's connection still \
                 points at the old file, where nobody reads what it writes: stopping (restart \
                 outboxd to work on the file now at that path)",
                db.display()
            );
            tracing::error!("{message}");
            if let Some(s) = &servers {
                s.fail(&message);
            }
            failure = Some(message);
            break;
        }
        captures.tick();
        alert_log.tick();
    }
    if failure.is_none() {
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            "signal received; finishing deliveries in flight (a second signal exits at once)"
        );
    }
    relay
        .shutdown(grace)
        .context("cannot shut the relay down cleanly")?;
    #[cfg(feature = "otlp")]
    if let Some(exporter) = &exporter {
        exporter.flush(grace);
    }
    if let Some(message) = failure {
        return Err(Failure::database(message).into());
    }
    tracing::info!("outboxd stopped");
    Ok(Exit::Ok)
}

/// `run`'s alert log: the health verdict (`status`'s, `/healthz`'s),
/// checked every [`ALERT_INTERVAL`]; a WARN line when a kind of problem
/// appears, an INFO line when it clears. The verdict's reads are bounded
/// (index seeks and ranges, the pending rows, the capture triggers), never a
/// count of the whole table.
struct AlertLog {
    db: PathBuf,
    thresholds: Thresholds,
    last: Option<Instant>,
    /// The kinds crossed at the last check.
    crossed: Vec<&'static str>,
}

impl AlertLog {
    fn new(db: &Path, thresholds: Thresholds) -> AlertLog {
        AlertLog {
            db: db.to_path_buf(),
            thresholds,
            last: None,
            crossed: Vec::new(),
        }
    }

    fn tick(&mut self) {
        if self.last.is_some_and(|t| t.elapsed() < ALERT_INTERVAL) {
            return;
        }
        // The first check says "ok" too, so a log shows the verdict.
        let first = self.last.is_none();
        self.last = Some(Instant::now());
        let verdict = outboxd::connection::open_read_only(&self.db)
            .and_then(|conn| alerts::verdict(&conn, &self.thresholds, outboxd::Timestamp::now()));
        let verdict = match verdict {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the health thresholds for the alert log");
                return;
            }
        };
        if first && verdict.is_empty() {
            tracing::info!("health: ok (no threshold crossed)");
        }
        for p in verdict.iter() {
            if !self.crossed.contains(&p.kind) {
                tracing::warn!(problem = p.kind, "health: {} ({})", p.message, p.threshold);
            }
        }
        for kind in &self.crossed {
            if !verdict.iter().any(|p| p.kind == *kind) {
                tracing::info!(problem = kind, "health: no longer a problem");
            }
        }
        self.crossed = verdict.iter().map(|p| p.kind).collect();
    }
}
