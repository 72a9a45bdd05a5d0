//! Just enough of the Chrome DevTools Protocol to drive Debian's headless `chromium` from a
//! test: open a page, run script in it, type, screenshot, and collect console errors,
//! uncaught exceptions and dialogs.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// A headless browser with one page.
pub struct Browser {
    child: tokio::process::Child,
    out: mpsc::UnboundedSender<Message>,
    pending: Pending,
    /// Console errors, exceptions and dialogs seen, as text.
    pub problems: Arc<Mutex<Vec<String>>>,
    session: String,
    next: u64,
    _profile: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The browser binary: `FERRIQ_TEST_CHROMIUM`, else `chromium` on the PATH.
pub fn chromium() -> String {
    std::env::var("FERRIQ_TEST_CHROMIUM").unwrap_or_else(|_| "chromium".into())
}

impl Browser {
    /// Starts the browser and opens a blank page.
    pub async fn start() -> Browser {
        let profile =
            std::env::temp_dir().join(format!("fq-chromium-{}", uuid::Uuid::new_v4().simple()));
        let mut child = tokio::process::Command::new(chromium())
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--remote-debugging-port=0",
                "--window-size=1280,860",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium starts (scripts/test.sh installs Debian's chromium)");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let ws_url = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.split("DevTools listening on ").nth(1) {
                    return url.trim().to_owned();
                }
            }
            panic!("chromium exited before listening")
        })
        .await
        .expect("chromium listens within 30 s");
        // Keep reading its stderr so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let (ws, _) = tokio_tungstenite::connect_async(ws_url.as_str())
            .await
            .expect("the DevTools socket");
        let (mut sink, mut stream) = ws.split();
        let (out, mut to_send) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = to_send.recv().await {
                if sink.send(m).await.is_err() {
                    return;
                }
            }
        });
        let pending: Pending = Arc::default();
        let problems: Arc<Mutex<Vec<String>>> = Arc::default();
        {
            let (pending, problems, out) = (pending.clone(), problems.clone(), out.clone());
            tokio::spawn(async move {
                while let Some(Ok(msg)) = stream.next().await {
                    let Message::Text(text) = msg else { continue };
                    let Ok(v) = serde_json::from_str::<Value>(&text) else {
                        continue;
                    };
                    if let Some(id) = v["id"].as_u64() {
                        if let Some(tx) = pending.lock().unwrap().remove(&id) {
                            let _ = tx.send(v);
                        }
                        continue;
                    }
                    event(&v, &problems, &out);
                }
            });
        }
        let mut browser = Browser {
            child,
            out,
            pending,
            problems,
            session: String::new(),
            next: 0,
            _profile: TempDir(profile),
        };
        let target = browser
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let attached = browser
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_owned();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.call(domain, json!({})).await;
        }
        browser
    }

    /// Sends a command (to the page once attached); its result.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        match self.try_call(method, params).await {
            Ok(result) => result,
            Err(error) => panic!("{method}: {error}"),
        }
    }

    /// Sends a command; its result, or the protocol's error object.
    async fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        self.out
            .send(Message::Text(msg.to_string().into()))
            .expect("the socket writer");
        let answer = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .unwrap_or_else(|_| panic!("{method}: no answer within 30 s"))
            .expect("an answer");
        match answer.get("error") {
            Some(error) => Err(error.clone()),
            None => Ok(answer["result"].clone()),
        }
    }

    /// Runs `expression` in the page (awaiting a promise); its value.
    pub async fn eval(&mut self, expression: &str) -> Value {
        match self.try_eval(expression).await {
            Ok(value) => value,
            Err(error) => panic!("Runtime.evaluate: {error}"),
        }
    }

    /// Runs `expression` in the page; its value, or the protocol's error (a navigation under
    /// it, among others). An exception the expression throws fails the test.
    async fn try_eval(&mut self, expression: &str) -> Result<Value, Value> {
        let r = self
            .try_call(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
            )
            .await?;
        assert!(
            r.get("exceptionDetails").is_none(),
            "{expression}: {}",
            r["exceptionDetails"]
        );
        Ok(r["result"]["value"].clone())
    }

    /// Waits (up to 15 s) until `expression` is true in the page.
    pub async fn wait_for(&mut self, expression: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let check = format!(
                "(() => {{ try {{ return !!({expression}); }} catch (e) {{ return false; }} }})()"
            );
            // A page navigating away while the check runs answers "Inspected target
            // navigated or closed" (or a destroyed context): the new page is not ready yet,
            // so that is a "not yet", not a failure.
            match self.try_eval(&check).await {
                Ok(Value::Bool(true)) => return,
                Ok(_) => {}
                Err(error) if is_navigation(&error) => {}
                Err(error) => panic!("Runtime.evaluate: {error}"),
            }
            if tokio::time::Instant::now() >= deadline {
                // Read with `try_eval`: a navigation here must not hide what was awaited.
                let at = self
                    .try_eval("location.href + ': ' + (document.body ? document.body.innerText.slice(0, 300) : '')")
                    .await;
                panic!("still false after 15 s: {expression}\n  page: {at:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Opens `url` and waits until it has loaded.
    pub async fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
        self.wait_for(&format!(
            "location.href === {} && document.readyState === 'complete' \
             && document.querySelector('main')",
            json!(url)
        ))
        .await;
    }

    /// Clicks the element `selector` finds, and waits for the page it leads to (a new
    /// document, loaded, with its `main`).
    pub async fn click_and_wait(&mut self, selector: &str) {
        let origin = self.eval("performance.timeOrigin").await;
        let click = format!("document.querySelector({}).click()", json!(selector));
        // The click may start the navigation before its own evaluation answers.
        if let Err(error) = self.try_eval(&click).await {
            assert!(is_navigation(&error), "{click}: {error}");
        }
        self.wait_for(&format!(
            "performance.timeOrigin !== {origin} && document.readyState === 'complete' \
             && document.querySelector('main')"
        ))
        .await;
    }

    /// Types `text` into the element `selector` finds, as a keyboard would.
    pub async fn type_into(&mut self, selector: &str, text: &str) {
        self.eval(&format!(
            "document.querySelector({}).focus()",
            json!(selector)
        ))
        .await;
        self.call("Input.insertText", json!({ "text": text })).await;
    }

    /// Writes a PNG of the page to `path`.
    pub async fn screenshot(&mut self, path: &Path) {
        let shot = self
            .call(
                "Page.captureScreenshot",
                json!({ "format": "png", "captureBeyondViewport": true }),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("image data"))
            .expect("base64");
        std::fs::write(path, png).expect("write the screenshot");
    }

    /// The problems seen so far, emptied.
    pub fn take_problems(&self) -> Vec<String> {
        std::mem::take(&mut *self.problems.lock().unwrap())
    }
}

/// Records a problem event; accepts dialogs (a confirm) after recording them.
fn event(v: &Value, problems: &Mutex<Vec<String>>, out: &mpsc::UnboundedSender<Message>) {
    let p = &v["params"];
    let problem = match v["method"].as_str().unwrap_or("") {
        "Runtime.exceptionThrown" => Some(format!(
            "exception: {}",
            p["exceptionDetails"]["exception"]["description"]
        )),
        "Runtime.consoleAPICalled" if p["type"] == "error" => {
            Some(format!("console.error: {}", p["args"]))
        }
        "Log.entryAdded" if p["entry"]["level"] == "error" => {
            Some(format!("log: {}", p["entry"]["text"]))
        }
        "Page.javascriptDialogOpening" => {
            let answer = json!({
                "id": 1_000_000 + rand_id(),
                "method": "Page.handleJavaScriptDialog",
                "params": { "accept": true },
                "sessionId": v["sessionId"],
            });
            let _ = out.send(Message::Text(answer.to_string().into()));
            Some(format!("dialog {}: {}", p["type"], p["message"]))
        }
        _ => None,
    };
    if let Some(p) = problem {
        problems.lock().unwrap().push(p);
    }
}

/// Whether a protocol error says the page navigated under the command (its document, and
/// so its script context, went away) rather than that the command was wrong.
fn is_navigation(error: &Value) -> bool {
    let message = error["message"].as_str().unwrap_or_default();
    message.contains("navigated or closed")
        || message.contains("Execution context was destroyed")
        || message.contains("Cannot find context")
        || message.contains("Cannot find default execution context")
}

fn rand_id() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0 % 1_000_000
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
