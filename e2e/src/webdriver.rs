//! A W3C WebDriver client for the UI's browser tests: headless Chromium driven by Debian's
//! `chromedriver` (started here, stopped by PID). Written here rather than taken from crates.io:
//! the maintained clients (fantoccini, thirtyfour) bring Mozilla's `webdriver` crate with a
//! second `http`, `cookie` and ICU into the one target directory, for the dozen commands
//! these tests send (see CONVENTIONS.md).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use podpath_client::http;
use serde_json::{json, Value};

/// The W3C name of an element reference in JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A browser session; the browser and its driver end when it is dropped.
pub struct Browser {
    driver: Child,
    addr: std::net::SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
}

/// An element of the page.
#[derive(Debug, Clone)]
pub struct Element(String);

/// Whether this machine has what the browser tests need.
pub fn available() -> Option<String> {
    for tool in ["chromedriver", "chromium"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            return Some(format!("{tool} is not installed (apt-get install chromium chromium-driver)"));
        }
    }
    None
}

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium of `width`×`height`.
    pub fn start(width: u32, height: u32) -> Result<Browser> {
        let port = crate::free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start chromedriver")?;
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let profile = tempfile::Builder::new().prefix("podpath-chromium-").tempdir()?;
        let mut b = Browser { driver, addr, session: String::new(), _profile: profile };
        let t = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            if t.elapsed() > Duration::from_secs(10) {
                bail!("chromedriver did not listen on {addr} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                // Root runs the tests: Chromium's sandbox refuses root.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         format!("--window-size={width},{height}"),
                         format!("--user-data-dir={}", b._profile.path().display())]
            }
        }}});
        let v = b.call("POST", "/session", Some(caps))?;
        b.session = v["sessionId"].as_str().ok_or_else(|| anyhow!("no session id: {v}"))?.to_string();
        Ok(b)
    }

    /// One WebDriver command: its `value`, or the driver's error.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let headers = [("Content-Type", "application/json; charset=utf-8")];
        let req = http::Request { method, path, headers: &headers, body: body.as_bytes() };
        let r = http::blocking(self.addr, &req, Duration::from_secs(60))
            .with_context(|| format!("WebDriver {method} {path}"))?;
        let v: Value =
            serde_json::from_slice(&r.body).with_context(|| format!("WebDriver {method} {path}: not JSON"))?;
        if r.status != 200 {
            bail!("WebDriver {method} {path}: HTTP {}: {} {}", r.status, v["value"]["error"], v["value"]["message"]);
        }
        Ok(v["value"].clone())
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    pub fn goto(&self, url: &str) -> Result<()> {
        self.call("POST", &self.s("/url"), Some(json!({"url": url}))).map(|_| ())
    }

    pub fn url(&self) -> Result<String> {
        Ok(self.call("GET", &self.s("/url"), None)?.as_str().unwrap_or_default().to_string())
    }

    /// The elements matching a CSS selector, now.
    pub fn all(&self, css: &str) -> Result<Vec<Element>> {
        let v = self.call("POST", &self.s("/elements"), Some(json!({"using": "css selector", "value": css})))?;
        Ok(v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[ELEMENT].as_str().map(|id| Element(id.into())))
            .collect())
    }

    /// Waits (at most `limit`) for an element matching `css`.
    pub fn wait(&self, css: &str, limit: Duration) -> Result<Element> {
        let t = Instant::now();
        loop {
            if let Some(e) = self.all(css)?.into_iter().next() {
                return Ok(e);
            }
            if t.elapsed() > limit {
                bail!(
                    "no element {css:?} on the page after {limit:?}; its text:\n{}",
                    self.page_text().unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (at most `limit`) until `f` of the page's text holds.
    pub fn wait_text(&self, css: &str, limit: Duration, f: impl Fn(&str) -> bool) -> Result<String> {
        let t = Instant::now();
        loop {
            let text = match self.all(css)?.first() {
                Some(e) => self.text(e)?,
                None => String::new(),
            };
            if f(&text) {
                return Ok(text);
            }
            if t.elapsed() > limit {
                bail!("{css:?} did not read as expected after {limit:?}: {text:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn text(&self, e: &Element) -> Result<String> {
        Ok(self.call("GET", &self.s(&format!("/element/{}/text", e.0)), None)?.as_str().unwrap_or_default().to_string())
    }

    pub fn attr(&self, e: &Element, name: &str) -> Result<Option<String>> {
        Ok(self.call("GET", &self.s(&format!("/element/{}/attribute/{name}", e.0)), None)?.as_str().map(String::from))
    }

    pub fn click(&self, e: &Element) -> Result<()> {
        self.call("POST", &self.s(&format!("/element/{}/click", e.0)), Some(json!({}))).map(|_| ())
    }

    /// Types into an input (after clearing it).
    pub fn fill(&self, e: &Element, text: &str) -> Result<()> {
        self.call("POST", &self.s(&format!("/element/{}/clear", e.0)), Some(json!({})))?;
        self.call("POST", &self.s(&format!("/element/{}/value", e.0)), Some(json!({"text": text}))).map(|_| ())
    }

    /// Runs a script in the page (`return …` gives its value).
    pub fn script(&self, script: &str, args: Value) -> Result<Value> {
        self.call("POST", &self.s("/execute/sync"), Some(json!({"script": script, "args": args})))
    }

    /// The visible text of the whole page.
    pub fn page_text(&self) -> Result<String> {
        Ok(self.script("return document.body.innerText", json!([]))?.as_str().unwrap_or_default().to_string())
    }

    /// Saves a PNG of the window.
    pub fn screenshot(&self, path: &Path) -> Result<()> {
        use base64::Engine as _;
        let v = self.call("GET", &self.s("/screenshot"), None)?;
        let png = base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap_or_default())?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png).with_context(|| format!("write {}", path.display()))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
