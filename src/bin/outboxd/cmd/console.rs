//! `outboxd console`: the web console alone, for a database a relay
//! elsewhere is working on; and [`HttpServers`], how `outboxd run` serves the
//! console, `/metrics` and `/healthz` beside its relay.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use outboxd::relay::Metrics;
use outboxd::router::Subscriptions;
use outboxd::status::Thresholds;

use super::config_arg::ConfigArg;
use super::Global;
use crate::config::{alerts, resolve_listen, Config, HttpServe, HttpSettings};
use crate::console::{self, Console, ConsoleSetup, Listeners};
use crate::exit::{Exit, Failure};

/// Shown under `outboxd console --help`.
pub(crate) const EXAMPLES: &str = "\
Serves the web console (overview with the last hour's chart, events, dead
letters with requeue and discard, replay, publish intents), /metrics and
/healthz for an existing database, without running a relay: use it beside a
relay that runs elsewhere, or to inspect a copy. The chart is derived from
the table.

Without --http the address is the config's [http] listen, else
127.0.0.1:9464. An address other than loopback needs a token:
--http-token-env VAR (or [http] token_env in the config, see
packaging/outboxd.example.toml) names the environment variable that holds
it.

With --config (or OUTBOXD_CONFIG), the database is the config's unless --db
or OUTBOXD_DB names one, [alerts] sets the health thresholds (as for
`outboxd status`), and the consumers' types let the console show each
consumer's retrying and dead events. Nothing is delivered.

Examples:
  outboxd --db app.db console                   # then open http://127.0.0.1:9464/
  outboxd --db app.db console --http 127.0.0.1:8080 --read-only
  OUTBOXD_HTTP_TOKEN=$(openssl rand -hex 32) \\
      outboxd console --http 0.0.0.0:9464 --http-token-env OUTBOXD_HTTP_TOKEN";

/// The address `outboxd console` serves on when none is given.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// Options of `outboxd console`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("config", |a| a.help(
    "A config file: its [http], [alerts] and consumers' types are used; nothing is delivered"
)))]
pub(crate) struct Args {
    /// Serve on this address (such as 127.0.0.1:9464); wins over the
    /// config's http.listen [default: 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// The environment variable holding the token (needed on an address
    /// other than loopback); wins over the config's http.token_env.
    #[arg(long, value_name = "VAR")]
    http_token_env: Option<String>,
    #[command(flatten)]
    config: ConfigArg,
    /// Hide every action (requeue, discard, replay).
    #[arg(long)]
    read_only: bool,
}

/// Serves the console until SIGINT or SIGTERM.
pub(crate) fn exec(global: &Global, args: &Args) -> Result<Exit> {
    // The config's settings, not its sinks: the console delivers nothing,
    // so no secret needs to be set.
    let (db, config) = args.config.summary(global)?;
    let log = config.as_ref().map(|c| c.log.clone()).unwrap_or_default();
    crate::init_logging(&global.log, &log, "info");
    let mut http = config.as_ref().map(|c| c.http.clone()).unwrap_or_default();
    http.read_only |= args.read_only;
    http = with_token_env(http, args.http_token_env.as_deref())?;
    let listen = match &args.http {
        Some(a) => Some(resolve_listen(a).map_err(|m| Failure::config(format!("--http: {m}")))?),
        None if http.listen.is_none() => {
            Some(resolve_listen(DEFAULT_LISTEN).map_err(Failure::config)?)
        }
        None => None,
    };
    let serve = serve(&http, listen)?.context("no address to serve on")?;
    let listener = bind(serve.listen, "the console", "--http or http.listen")?;
    // The address bound (the port given may be 0).
    let addr = listener.local_addr().unwrap_or(serve.listen);
    super::database::for_reading(&db)?;
    let signals = super::signals::install_handler()?;
    let started = console::start(
        Listeners {
            console: Some((listener, serve)),
            probes: None,
        },
        ConsoleSetup {
            db: db.clone(),
            thresholds: config
                .as_ref()
                .map_or_else(alerts::without_config, |c| c.alerts),
            consumers: match &config {
                Some(c) => subscriptions(c.consumers.iter().zip(&c.consumer_types))?,
                None => Subscriptions::default(),
            },
            relay: None,
        },
    )?;
    tracing::info!(
        database = %db.display(),
        "serving the console at http://{}/ (no relay in this process); SIGINT or SIGTERM stops it",
        addr
    );
    let _ = signals.recv();
    started.stop();
    tracing::info!("console stopped");
    Ok(Exit::Ok)
}

/// The HTTP servers of `outboxd run`, their addresses bound before the
/// relay starts (so a taken port is a config error, not a half-started
/// relay), started beside it.
pub(crate) struct HttpServers {
    console: Option<(TcpListener, HttpServe)>,
    metrics: Option<TcpListener>,
    thresholds: Thresholds,
    consumers: Subscriptions,
}

impl HttpServers {
    /// Binds `[http]` (or `--http`) for the console and the legacy
    /// `[metrics]` (or `--metrics`) address for /metrics and /healthz.
    pub(crate) fn bind(
        config: &Config,
        http: Option<&str>,
        token_env: Option<&str>,
        metrics: Option<SocketAddr>,
    ) -> Result<HttpServers> {
        let listen = match http {
            Some(a) => {
                Some(resolve_listen(a).map_err(|m| Failure::config(format!("--http: {m}")))?)
            }
            None => None,
        };
        let serve = serve(&with_token_env(config.http.clone(), token_env)?, listen)?;
        if let Some(s) = &serve {
            crate::config::http::distinct_from_metrics(s.listen, metrics)
                .map_err(|e| Failure::config(format!("{}: {e}", e.field())))?;
        }
        let console = match serve {
            Some(s) => Some((bind(s.listen, "the console", "--http or http.listen")?, s)),
            None => None,
        };
        let metrics = match metrics {
            Some(addr) => Some(bind(addr, "metrics", "--metrics or metrics.listen")?),
            None => None,
        };
        Ok(HttpServers {
            console,
            metrics,
            thresholds: config.alerts,
            consumers: subscriptions(config.consumers.iter().map(|c| (&c.name, &c.types)))?,
        })
    }

    /// Starts the servers for the relay whose counters are `relay`: one
    /// console app (one read pool, one set of measures and threads)
    /// answering both addresses; None when neither is configured.
    pub(crate) fn start(self, db: &Path, relay: Arc<Metrics>) -> Result<Option<Console>> {
        if self.console.is_none() && self.metrics.is_none() {
            return Ok(None);
        }
        let c = console::start(
            Listeners {
                console: self.console,
                probes: self.metrics,
            },
            ConsoleSetup {
                db: db.to_path_buf(),
                thresholds: self.thresholds,
                consumers: self.consumers,
                relay: Some(relay),
            },
        )?;
        if let Some(addr) = c.console_addr() {
            tracing::info!("serving the console at http://{addr}/ (with /metrics and /healthz)");
        }
        if let Some(addr) = c.probes_addr() {
            // As the metrics server logged it before the console (scripts
            // and tests read the address from this line).
            tracing::info!(address = ?Some(addr), "serving Prometheus metrics at /metrics (and /healthz)");
        }
        Ok(Some(c))
    }
}

/// `http` with `--http-token-env`, when given, winning over `token_env`.
fn with_token_env(mut http: HttpSettings, flag: Option<&str>) -> Result<HttpSettings> {
    if let Some(name) = flag {
        crate::config::http::check_token_env_name(name)
            .map_err(|m| Failure::config(format!("--http-token-env: {m}")))?;
        http.token_env = Some(name.to_string());
    }
    Ok(http)
}

/// The server to start, or a config error naming the field.
fn serve(http: &HttpSettings, listen: Option<SocketAddr>) -> Result<Option<HttpServe>> {
    http.serve(listen)
        .map_err(|e| Failure::config(format!("{}: {e}", e.field())).into())
}

fn bind(addr: SocketAddr, what: &str, flag: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| {
        Failure::config(format!(
            "cannot serve {what} on {addr}: {e}; choose a free address with {flag}"
        ))
        .into()
    })
}

/// Each consumer's name and the patterns it takes, routed by the library's
/// router. The config check refuses a bad pattern first; one that got here
/// anyway is refused at its field, never dropped.
fn subscriptions<'a>(
    consumers: impl Iterator<Item = (&'a String, &'a Vec<String>)>,
) -> Result<Subscriptions> {
    Subscriptions::parse(consumers.map(|(name, types)| (name.as_str(), types))).map_err(|e| {
        Failure::config(format!(
            "consumer[{}].types[{}]: {}",
            e.consumer(),
            e.index(),
            e.pattern_error()
        ))
        .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_pattern_is_refused_at_its_field_not_dropped() {
        let (a, b) = ("hook".to_string(), "audit".to_string());
        let (good, bad) = (
            vec!["article.*.v1".to_string()],
            vec!["*".to_string(), "Article.created".to_string()],
        );
        let e = subscriptions([(&a, &good), (&b, &bad)].into_iter()).unwrap_err();
        let failure = e.downcast_ref::<Failure>().unwrap();
        assert_eq!(failure.exit, crate::exit::Exit::Config);
        assert!(
            failure.to_string().starts_with("consumer[1].types[1]: "),
            "{failure}"
        );
        let subs = subscriptions([(&a, &good), (&b, &bad[..1].to_vec())].into_iter()).unwrap();
        let to: Vec<&str> = subs.consumers_for("article.created.v1").collect();
        assert_eq!(to, ["hook", "audit"]);
    }
}
