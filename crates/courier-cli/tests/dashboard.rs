//! The dashboard as an operator uses it: real headless Chromium (Debian's
//! `chromium`, driven over WebDriver by `chromedriver`) against the real
//! `courier serve` binary with tokens, a webhook subscription to an endpoint
//! that fails and then recovers, and a native stream.
//!
//! One scenario, in order: sign in with the form; the overview shows the
//! subscription and the throughput chart; a dead letter made by the failing
//! endpoint is listed; the endpoint recovers; the operator retries it from
//! the page (confirming a count of 1) and watches the message complete;
//! the payload shows a 20-digit integer exactly and a script in it as text;
//! then a read-only token sees no action button and is refused when it
//! tries anyway. A screenshot of each page is written under
//! `target/dashboard-screenshots/`.
//!
//! `scripts/test` installs `chromium` and `chromium-driver` when missing;
//! without them this test fails and says so (it is never skipped).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use courier_testkit::eventually;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const BINARY: &str = env!("CARGO_BIN_EXE_courier");
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const OPERATOR_TOKEN: &str = "ops-token-for-the-browser-test";
const VIEWER_TOKEN: &str = "viewer-token-for-the-browser-test";
/// How long a page may take to show what the test waits for.
const PAGE_WAIT: Duration = Duration::from_secs(20);

/// A webhook endpoint that answers 500 until it is made healthy.
#[derive(Clone, Default)]
struct Endpoint {
    healthy: Arc<AtomicBool>,
    calls: Arc<AtomicU32>,
}

async fn hook(State(endpoint): State<Endpoint>) -> StatusCode {
    endpoint.calls.fetch_add(1, Ordering::SeqCst);
    if endpoint.healthy.load(Ordering::SeqCst) {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

async fn start_endpoint() -> anyhow::Result<(Endpoint, u16)> {
    let endpoint = Endpoint::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let app = axum::Router::new()
        .route("/hook", post(hook))
        .with_state(endpoint.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((endpoint, port))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn config(dir: &Path, port: u16, hook_port: u16) -> String {
    format!(
        r#"
listen = "127.0.0.1:{port}"
database_url = "{database}"
shutdown_timeout_ms = 2000

[[tokens]]
name = "ops"
sha256 = "{ops}"
tenants = ["*"]
roles = ["admin", "read", "publish"]

[[tokens]]
name = "viewer"
sha256 = "{viewer}"
tenants = ["acme"]
roles = ["read"]

[[subscriptions]]
name = "order-hooks"
topics = ["order.*"]
concurrency = 4
[subscriptions.retry]
max_attempts = 2
base_ms = 50
cap_ms = 100
[subscriptions.target]
type = "webhook"
url = "http://127.0.0.1:{hook_port}/hook"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
timeout_ms = 2000
"#,
        database = dir.join("courier.db").display(),
        ops = sha256(OPERATOR_TOKEN),
        viewer = sha256(VIEWER_TOKEN),
    )
}

/// Where screenshots go: `target/dashboard-screenshots`, beside the binary's
/// profile directory.
fn screenshot_dir() -> anyhow::Result<PathBuf> {
    let profile = Path::new(BINARY)
        .parent()
        .ok_or_else(|| anyhow::anyhow!("the binary has no directory"))?;
    let target = profile.parent().unwrap_or(profile);
    let dir = target.join("dashboard-screenshots");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn screenshot(browser: &Client, name: &str) -> anyhow::Result<()> {
    let png = browser.screenshot().await?;
    std::fs::write(screenshot_dir()?.join(format!("{name}.png")), png)?;
    Ok(())
}

/// `chromedriver` on a free port, stopped when dropped.
struct Driver {
    _process: tokio::process::Child,
    port: u16,
}

impl Driver {
    async fn start() -> anyhow::Result<Self> {
        for program in [CHROMIUM, CHROMEDRIVER] {
            anyhow::ensure!(
                Path::new(program).exists(),
                "{program} is missing: the dashboard test needs Debian's chromium and \
                 chromium-driver (scripts/test installs them: apt-get install chromium chromium-driver)"
            );
        }
        let port = free_port()?;
        let process = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let up = eventually(Duration::from_secs(20), || async move {
            matches!(
                reqwest::get(format!("http://127.0.0.1:{port}/status")).await,
                Ok(response) if response.status().is_success()
            )
        })
        .await;
        anyhow::ensure!(up, "chromedriver did not start on port {port}");
        Ok(Self {
            _process: process,
            port,
        })
    }

    async fn browser(&self, profile: &Path) -> anyhow::Result<Client> {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        Ok(
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(capabilities)
                .connect(&format!("http://127.0.0.1:{}", self.port))
                .await?,
        )
    }
}

/// The element with `data-test="name"`, once it is on the page.
async fn wait_for(browser: &Client, name: &str) -> anyhow::Result<fantoccini::elements::Element> {
    let selector = format!("[data-test=\"{name}\"]");
    browser
        .wait()
        .at_most(PAGE_WAIT)
        .for_element(Locator::Css(&selector))
        .await
        .map_err(|error| anyhow::anyhow!("waiting for {name}: {error}"))
}

/// Every element with `data-test="name"` now.
async fn all(browser: &Client, name: &str) -> anyhow::Result<Vec<fantoccini::elements::Element>> {
    Ok(browser
        .find_all(Locator::Css(&format!("[data-test=\"{name}\"]")))
        .await?)
}

/// Waits until the text of `data-test="name"` satisfies `check`.
async fn wait_for_text(
    browser: &Client,
    name: &str,
    check: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    let started = std::time::Instant::now();
    loop {
        let mut last = String::new();
        for element in all(browser, name).await? {
            // A page that redraws (the overview every 5 s) may have replaced
            // the element since it was found: look again.
            let Ok(text) = element.text().await else {
                continue;
            };
            if check(&text) {
                return Ok(text);
            }
            last = text;
        }
        anyhow::ensure!(
            started.elapsed() < PAGE_WAIT,
            "{name} never showed the expected text; last: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn sign_in(browser: &Client, base: &str, token: &str) -> anyhow::Result<()> {
    browser.goto(&format!("{base}/")).await?;
    wait_for(browser, "signin-token")
        .await?
        .send_keys(token)
        .await?;
    wait_for(browser, "signin-submit").await?.click().await?;
    wait_for(browser, "whoami").await?;
    Ok(())
}

/// What `fetch(path, POST json)` answers in the page, with its session cookie.
async fn post_from_page(browser: &Client, path: &str, body: Value) -> anyhow::Result<u64> {
    let status = browser
        .execute_async(
            "const [path, body, done] = arguments;
             fetch(path, {method: 'POST', credentials: 'same-origin',
                          headers: {'Content-Type': 'application/json'},
                          body: JSON.stringify(body)})
               .then(r => done(r.status), e => done(String(e)));",
            vec![json!(path), body],
        )
        .await?;
    status
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("fetch failed in the page: {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_a_dead_letter_from_the_page_and_watches_it_complete(
) -> anyhow::Result<()> {
    let driver = Driver::start().await?;
    let (endpoint, hook_port) = start_endpoint().await?;
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    std::fs::write(
        dir.path().join("courier.toml"),
        config(dir.path(), port, hook_port),
    )?;
    let mut daemon = tokio::process::Command::new(BINARY)
        .arg("serve")
        .arg("--config")
        .arg(dir.path().join("courier.toml"))
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let base = format!("http://127.0.0.1:{port}");
    let api = reqwest::Client::new();
    let up = eventually(Duration::from_secs(30), || {
        let api = api.clone();
        let base = base.clone();
        async move {
            matches!(api.get(format!("{base}/readyz")).send().await,
                     Ok(response) if response.status().is_success())
        }
    })
    .await;
    anyhow::ensure!(up, "courier serve did not become ready");

    // Two orders the endpoint refuses until they are dead letters. The
    // payload holds an integer no double can hold, and markup that must
    // show as text.
    let mut ids = Vec::new();
    for order in ["18446744073709551617", "2"] {
        let body = format!(
            r#"{{"tenant":"acme","topic":"order.placed","headers":{{"x-note":"<b>bold</b>"}},"payload":{{"order":{order},"note":"<img src=x onerror=document.title='pwned'>"}}}}"#
        );
        let reply = api
            .post(format!("{base}/v1/messages"))
            .bearer_auth(OPERATOR_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        anyhow::ensure!(reply.status().is_success(), "publish: {}", reply.status());
        let reply: Value = serde_json::from_str(&reply.text().await?)?;
        ids.push(reply["id"].as_str().unwrap_or_default().to_owned());
    }
    let dead = eventually(Duration::from_secs(30), || {
        let api = api.clone();
        let base = base.clone();
        async move {
            let page: Value = match api
                .get(format!("{base}/v1/dead-letters"))
                .bearer_auth(OPERATOR_TOKEN)
                .send()
                .await
            {
                Ok(reply) => serde_json::from_str(&reply.text().await.unwrap_or_default())
                    .unwrap_or(Value::Null),
                Err(_) => return false,
            };
            page["items"].as_array().map_or(0, Vec::len) == 2
        }
    })
    .await;
    anyhow::ensure!(dead, "the failing endpoint did not make two dead letters");
    // A native stream with a group, for the streams page.
    let entries = api
        .post(format!("{base}/v1/streams/acme/orders/entries"))
        .bearer_auth(OPERATOR_TOKEN)
        .header("content-type", "application/json")
        .body(json!({"entries": [{"payload": {"n": 1}}, {"payload": {"n": 2}}]}).to_string())
        .send()
        .await?;
    anyhow::ensure!(
        entries.status().is_success(),
        "append: {}",
        entries.status()
    );
    let group = api
        .put(format!("{base}/v1/streams/acme/orders/groups/packers"))
        .bearer_auth(OPERATOR_TOKEN)
        .header("content-type", "application/json")
        .body(json!({"start": "beginning"}).to_string())
        .send()
        .await?;
    anyhow::ensure!(group.status().is_success(), "group: {}", group.status());

    let profile = tempfile::tempdir()?;
    let browser = driver.browser(profile.path()).await?;
    let outcome = scenario(&browser, &base, &endpoint, &ids).await;
    let _ = browser.close().await;
    let _ = daemon.start_kill();
    outcome
}

async fn scenario(
    browser: &Client,
    base: &str,
    endpoint: &Endpoint,
    ids: &[String],
) -> anyhow::Result<()> {
    // Not signed in: the form.
    browser.goto(&format!("{base}/")).await?;
    wait_for(browser, "signin-form").await?;
    screenshot(browser, "sign-in").await?;
    // A wrong token is refused on the page.
    wait_for(browser, "signin-token")
        .await?
        .send_keys("wrong")
        .await?;
    wait_for(browser, "signin-submit").await?.click().await?;
    wait_for_text(browser, "error", |text| !text.is_empty()).await?;

    sign_in(browser, base, OPERATOR_TOKEN).await?;
    wait_for_text(browser, "whoami", |text| text.contains("ops")).await?;
    // The overview: the subscription's row and the live chart.
    wait_for(browser, "nav-overview").await?.click().await?;
    wait_for_text(browser, "stats-row", |text| text.contains("order-hooks")).await?;
    wait_for(browser, "throughput-chart").await?;
    screenshot(browser, "overview").await?;

    // The dead letters, with a count-stating confirmation.
    wait_for(browser, "nav-dead-letters").await?.click().await?;
    wait_for(browser, "dead-letter-row").await?;
    anyhow::ensure!(all(browser, "dead-letter-row").await?.len() == 2);
    screenshot(browser, "dead-letters").await?;
    endpoint.healthy.store(true, Ordering::SeqCst);
    let calls_before = endpoint.calls.load(Ordering::SeqCst);
    let target = ids[0].as_str();
    let rows = all(browser, "dead-letter-row").await?;
    let mut selected = false;
    for row in rows {
        if row.attr("data-message-id").await?.as_deref() == Some(target) {
            row.find(Locator::Css("[data-test=\"dead-letter-select\"]"))
                .await?
                .click()
                .await?;
            selected = true;
        }
    }
    anyhow::ensure!(selected, "no row for message {target}");
    wait_for(browser, "dead-letter-retry")
        .await?
        .click()
        .await?;
    wait_for(browser, "confirm-dialog").await?;
    let question = wait_for_text(browser, "confirm-text", |text| !text.is_empty()).await?;
    anyhow::ensure!(
        question == "Retry 1 dead letter?",
        "the confirmation states the count: {question:?}"
    );
    screenshot(browser, "dead-letters-confirm").await?;
    wait_for(browser, "confirm-ok").await?.click().await?;
    let result = wait_for_text(browser, "result", |text| text.contains('1')).await?;
    screenshot(browser, "dead-letters-retried").await?;

    // The message page: it completes once delivered; the payload is exact
    // and its markup is text.
    browser.goto(&format!("{base}/#/messages/{target}")).await?;
    let started = std::time::Instant::now();
    loop {
        wait_for(browser, "message-detail").await?;
        let states = all(browser, "delivery-state").await?;
        let mut texts = Vec::new();
        for state in states {
            texts.push(state.text().await?);
        }
        if texts.iter().any(|text| text.contains("completed")) {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "the retried message never showed completed: {texts:?} (result: {result:?})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        browser.refresh().await?;
    }
    anyhow::ensure!(endpoint.calls.load(Ordering::SeqCst) > calls_before);
    let payload = wait_for(browser, "payload").await?.text().await?;
    anyhow::ensure!(
        payload.contains("18446744073709551617"),
        "payload shown: {payload}"
    );
    anyhow::ensure!(
        payload.contains("<img src=x"),
        "markup shown as text: {payload}"
    );
    anyhow::ensure!(browser.title().await? != "pwned", "a payload ran as script");
    let headers = wait_for(browser, "headers-table").await?.text().await?;
    anyhow::ensure!(
        headers.contains("<b>bold</b>"),
        "a header's markup shown as text: {headers}"
    );
    screenshot(browser, "message").await?;
    // The other order is still a dead letter: its page shows the errors.
    browser
        .goto(&format!("{base}/#/messages/{}", ids[1]))
        .await?;
    wait_for_text(browser, "delivery-state", |text| text.contains("dead")).await?;
    let errors = all(browser, "error-entry").await?;
    anyhow::ensure!(
        errors.len() == 2,
        "both failed attempts are shown: {}",
        errors.len()
    );
    let first = errors[0].text().await?;
    anyhow::ensure!(
        first.contains("500"),
        "the error names the status: {first:?}"
    );
    screenshot(browser, "message-dead").await?;

    // Subscriptions and streams.
    wait_for(browser, "nav-subscriptions")
        .await?
        .click()
        .await?;
    wait_for_text(browser, "subscription-row", |text| {
        text.contains("order-hooks")
    })
    .await?;
    screenshot(browser, "subscriptions").await?;
    browser
        .goto(&format!("{base}/#/subscriptions/order-hooks"))
        .await?;
    wait_for(browser, "subscription-detail").await?;
    wait_for(browser, "pause").await?;
    screenshot(browser, "subscription").await?;
    wait_for(browser, "nav-streams").await?.click().await?;
    wait_for_text(browser, "stream-row", |text| text.contains("orders")).await?;
    screenshot(browser, "streams").await?;

    // A read-only token: no action buttons, and refused if it tries.
    wait_for(browser, "signout").await?.click().await?;
    wait_for(browser, "signin-form").await?;
    sign_in(browser, base, VIEWER_TOKEN).await?;
    wait_for_text(browser, "whoami", |text| text.contains("viewer")).await?;
    wait_for(browser, "nav-dead-letters").await?.click().await?;
    wait_for(browser, "dead-letter-row").await?;
    anyhow::ensure!(all(browser, "dead-letter-row").await?.len() == 1);
    for button in ["dead-letter-retry", "dead-letter-discard"] {
        anyhow::ensure!(
            all(browser, button).await?.is_empty(),
            "a read-only token was shown {button}"
        );
    }
    screenshot(browser, "read-only").await?;
    let status = post_from_page(
        browser,
        "/v1/dead-letters/retry",
        json!({"filter": {"tenant": "acme"}}),
    )
    .await?;
    anyhow::ensure!(
        status == 403,
        "a read-only session's retry answered {status}"
    );
    browser
        .goto(&format!("{base}/#/subscriptions/order-hooks"))
        .await?;
    wait_for(browser, "subscription-detail").await?;
    anyhow::ensure!(
        all(browser, "pause").await?.is_empty() && all(browser, "resume").await?.is_empty()
    );
    Ok(())
}
