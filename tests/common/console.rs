//! What the console's tests share: a running `outboxd` serving HTTP, the
//! tests' HTTP client (tests/common/http.rs: every header is the test's
//! choice), and headless Chromium driven over WebDriver.
//!
//! The browser is Debian's `chromium` driven by `chromedriver` through the
//! W3C WebDriver protocol: plain JSON over HTTP, so the tests need no
//! browser-automation crate (and no async runtime), only this client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::bin::{Outboxd, Running};
use std::time::Duration;

use serde_json::{json, Value};

pub use crate::common::wait_until;

// ---------------------------------------------------------------------------
// outboxd.

/// Starts `outboxd --db DB ARGS` (with extra environment variables) through
/// the tests' one harness for the binary (tests/common/bin.rs).
pub fn spawn(db: &Path, args: &[&str], env: &[(&str, &str)]) -> Running {
    let mut cmd = Outboxd::on(db).command(args);
    cmd.envs(env.iter().copied());
    Running::spawn(&mut cmd)
}

// ---------------------------------------------------------------------------
// HTTP.

// Not every test binary that holds this module calls all of them.
#[allow(unused_imports)]
pub use crate::common::http::{get, request, Reply};

/// A form POSTed as the console's own page sends it (its Origin).
pub fn post_form(addr: &str, path: &str, pairs: &[(&str, &str)]) -> Reply {
    post_form_with(addr, path, &[], pairs)
}

/// [`post_form`] with more headers (a Cookie, an X-Forwarded-For).
pub fn post_form_with(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    pairs: &[(&str, &str)],
) -> Reply {
    let own = format!("http://{addr}");
    let mut all = vec![
        ("Origin", own.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    all.extend_from_slice(headers);
    request(addr, "POST", path, &all, &form(pairs))
}

/// The CSRF token written into a page's forms.
pub fn csrf(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no CSRF field in:\n{html}"));
    let rest = &html[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

/// A url-encoded form body.
pub fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            format!(
                "{k}={}",
                v.replace(' ', "+").replace(':', "%3A").replace('*', "%2A")
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

// ---------------------------------------------------------------------------
// The browser.

/// Whether Chromium and chromedriver are installed; outside CI a missing
/// one skips the test, in CI it fails it (common::available).
pub fn browser_available() -> bool {
    ["chromium", "chromedriver"]
        .iter()
        .all(|p| crate::common::available(p, &["--version"]))
}

/// The address chromedriver listens on, from its "started successfully on
/// port N." line (waited for at most 30 s). Its stdout is read to the end
/// on a thread, so it never blocks on a full pipe.
fn driver_address(driver: &mut Child) -> String {
    let stdout = driver.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.split_once("started successfully on port ") {
                let port: String = rest.1.chars().take_while(char::is_ascii_digit).collect();
                let _ = tx.send(port);
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(port) => format!("127.0.0.1:{port}"),
        Err(_) => {
            let _ = driver.kill();
            panic!("chromedriver did not say its port within 30 s");
        }
    }
}

/// Headless Chromium in a WebDriver session, ended when dropped.
pub struct Browser {
    driver: Child,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

/// The W3C WebDriver element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    /// Starts chromedriver and a headless Chromium session (the flags a
    /// closed network needs: no background connections, a fresh profile).
    pub fn start() -> Browser {
        let profile = tempfile::tempdir().unwrap();
        // Port 0: chromedriver binds a free port itself and says which on
        // stdout, so no other process can take it in between.
        let mut driver = Command::new("chromedriver")
            .arg("--port=0")
            .arg(format!(
                "--log-path={}",
                profile.path().join("chromedriver.log").display()
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver");
        let addr = driver_address(&mut driver);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let mut b = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
        };
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_string();
        b
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let headers: &[(&str, &str)] = if body.is_empty() {
            &[]
        } else {
            &[("Content-Type", "application/json")]
        };
        let r = request(&self.addr, method, path, headers, &body);
        let v: Value = serde_json::from_str(&r.body)
            .unwrap_or_else(|e| panic!("WebDriver {path}: {e}: {}", r.body));
        if r.status != 200 {
            panic!("WebDriver {method} {path} failed ({}): {v}", r.status);
        }
        v["value"].clone()
    }

    fn s(&self, path: &str) -> String {
        format!("/session/{}{path}", self.session)
    }

    /// Loads a page and waits for it.
    pub fn goto(&self, url: &str) {
        self.call("POST", &self.s("/url"), Some(json!({ "url": url })));
    }

    /// The current URL.
    pub fn url(&self) -> String {
        self.call("GET", &self.s("/url"), None)
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Waits until the page's URL satisfies `cond` (a click that submits a
    /// form may return before the next page is there).
    pub fn wait_url(&self, what: &str, cond: impl Fn(&str) -> bool) {
        wait_until(what, Duration::from_secs(30), || {
            cond(&self.url())
                && self.exec("return document.readyState") == Value::String("complete".into())
        });
    }

    fn find(&self, css: &str) -> String {
        let v = self.call(
            "POST",
            &self.s("/element"),
            Some(json!({"using": "css selector", "value": css})),
        );
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    /// The visible text of the first element matching `css`.
    pub fn text(&self, css: &str) -> String {
        let id = self.find(css);
        self.call("GET", &self.s(&format!("/element/{id}/text")), None)
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Clicks the first element matching `css` (a link or a submit button
    /// navigates, and the call returns once the new page has loaded).
    pub fn click(&self, css: &str) {
        let id = self.find(css);
        self.call(
            "POST",
            &self.s(&format!("/element/{id}/click")),
            Some(json!({})),
        );
    }

    /// Runs a script in the page (WebDriver's own channel, which the page's
    /// CSP does not govern) and returns its value.
    pub fn exec(&self, script: &str) -> Value {
        self.call(
            "POST",
            &self.s("/execute/sync"),
            Some(json!({"script": script, "args": []})),
        )
    }

    /// The page's HTML as the browser holds it.
    pub fn source(&self) -> String {
        self.call("GET", &self.s("/source"), None)
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Writes a PNG screenshot of the window.
    pub fn screenshot(&self, path: &Path) {
        use base64::Engine;
        let v = self.call("GET", &self.s("/screenshot"), None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                request(
                    &self.addr,
                    "DELETE",
                    &format!("/session/{}", self.session),
                    &[],
                    "",
                )
            }));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Where screenshots go: target/console-screenshots/ (a test artifact).
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("console-screenshots")
}
