//! The retry rules against a scripted fake API server (a `tower` service under a real
//! `kube::Client`), on tokio's paused clock.

use std::collections::VecDeque;

use http_body_util::Full;

use std::sync::atomic::AtomicU64;

use super::*;
use crate::k8s::budget::{FairCap, Limit};
use crate::metrics::{Limiter, Observer};

/// One request the fake server saw: when, method, path, body.
type Seen = (Instant, String, String, Bytes);

/// A scripted answer: status and `Retry-After`.
#[derive(Clone, Copy)]
struct Answer(u16, Option<&'static str>);

/// A fake API server answering from a script (then 200 `{}` for ever), recording each
/// request; and a `kube::Client` over it with the [`RetryAfter`] layer.
struct Fake {
    seen: Arc<Mutex<Vec<Seen>>>,
    client: kube::Client,
    /// Milliseconds the server takes to answer.
    latency: Arc<AtomicU64>,
}

impl Fake {
    fn new(script: &[Answer]) -> Self {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let latency: Arc<AtomicU64> = Arc::default();
        let shared_latency = latency.clone();
        let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
        let record = seen.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let record = record.clone();
            let latency = shared_latency.clone();
            let answer = script.lock().pop_front().unwrap_or(Answer(200, None));
            let latency = latency.clone();
            async move {
                let (head, body) = request.into_parts();
                let body = body.collect().await?.to_bytes();
                let delay = Duration::from_millis(latency.load(Ordering::Relaxed));
                record.lock().push((
                    Instant::now(),
                    head.method.to_string(),
                    head.uri.path().to_owned(),
                    body,
                ));
                tokio::time::sleep(delay).await;
                let mut response = Response::builder()
                    .status(answer.0)
                    .header(PRIORITY_LEVEL_HEADER, "pl-uid")
                    .header(FLOW_SCHEMA_HEADER, "fs-uid");
                if let Some(after) = answer.1 {
                    response = response.header(http::header::RETRY_AFTER, after);
                }
                let text = if answer.0 == 200 {
                    "{}"
                } else {
                    "Too many requests, please try again later."
                };
                Ok::<_, tower::BoxError>(
                    response
                        .body(Full::new(Bytes::from(text)))
                        .expect("valid response"),
                )
            }
        });
        let service = tower::ServiceBuilder::new()
            .layer(RetryAfterLayer)
            .service(service);
        Self {
            seen,
            client: kube::Client::new(service, "default"),
            latency,
        }
    }

    /// A PATCH of VolumeAttachment `name` with a small body.
    async fn patch(&self, name: &str) -> kube::Result<String> {
        let request = Request::patch(format!("/apis/storage.k8s.io/v1/volumeattachments/{name}"))
            .header("content-type", "application/merge-patch+json")
            .body(br#"{"status":{"attached":true}}"#.to_vec())
            .expect("valid request");
        self.client.request_text(request).await
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }
}

/// What the budget's observer was told.
#[derive(Debug, Default)]
struct Told {
    too_many: Mutex<u64>,
    waited: Mutex<Duration>,
}

#[derive(Debug)]
struct Recorder(Arc<Told>);

impl Observer for Recorder {
    fn waited(&self, _: Duration) {}
    fn throttled(&self, _: Limiter) {}
    fn too_many_requests(&self) {
        *self.0.too_many.lock() += 1;
    }
    fn retry_after_waited(&self, waited: Duration) {
        *self.0.waited.lock() += waited;
    }
}

fn budget(name: &str, limit: Limit) -> (Arc<ApiBudget>, Arc<Told>) {
    let told = Arc::new(Told::default());
    let b = ApiBudget::new(
        name,
        limit,
        FairCap::new(Limit::Unlimited),
        Box::new(Recorder(told.clone())),
    );
    (b, told)
}

fn work(budget: &Arc<ApiBudget>, deadline: Duration) -> Scope {
    Scope::new(budget.clone(), Kind::Work, Instant::now() + deadline)
}

#[test]
fn only_a_429_or_a_5xx_with_a_whole_number_of_seconds_asks_for_a_retry() {
    let with = |after: &str| {
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, after.parse().expect("header"));
        h
    };
    let none = HeaderMap::new();
    let s = |code: u16| StatusCode::from_u16(code).expect("status");
    assert_eq!(
        retry_after(s(429), &with("3")),
        Some(Duration::from_secs(3))
    );
    assert_eq!(
        retry_after(s(500), &with("1")),
        Some(Duration::from_secs(1))
    );
    assert_eq!(
        retry_after(s(503), &with(" 2 ")),
        Some(Duration::from_secs(2))
    );
    assert_eq!(retry_after(s(504), &with("0")), Some(Duration::ZERO));
    // A negative wait is no wait (client-go's timer fires at once).
    assert_eq!(retry_after(s(429), &with("-4")), Some(Duration::ZERO));
    // No header, a date, or a fraction: no retry.
    assert_eq!(retry_after(s(429), &none), None);
    assert_eq!(retry_after(s(503), &none), None);
    assert_eq!(
        retry_after(s(429), &with("Wed, 21 Oct 2026 07:28:00 GMT")),
        None
    );
    assert_eq!(retry_after(s(429), &with("1.5")), None);
    // Other statuses never, whatever they carry.
    for code in [200, 201, 404, 409, 422, 403, 408, 499] {
        assert_eq!(retry_after(s(code), &with("1")), None, "{code}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_429_is_waited_out_and_the_same_request_sent_again() {
    let fake = Fake::new(&[Answer(429, Some("3"))]);
    let (b, told) = budget("d", Limit::Unlimited);
    let start = Instant::now();
    let answer = scoped(work(&b, Duration::from_secs(30)), fake.patch("va-1")).await;
    assert_eq!(answer.expect("answered 200 on the retry"), "{}");
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].0 - seen[0].0,
        Duration::from_secs(3),
        "waited as asked"
    );
    assert_eq!(seen[0].0, start);
    assert_eq!(
        (&seen[0].1, &seen[0].2, &seen[0].3),
        (&seen[1].1, &seen[1].2, &seen[1].3),
        "the same method, path and body"
    );
    assert_eq!(seen[1].1, "PATCH");
    assert_eq!(*told.too_many.lock(), 1);
    assert_eq!(*told.waited.lock(), Duration::from_secs(3));
    let status = b.status();
    assert_eq!(status.pushback.too_many_requests, 1);
    assert!(status.pushback.throttled);
    assert_eq!(
        status.pushback.priority_level_uid.as_deref(),
        Some("pl-uid")
    );
    assert_eq!(status.pushback.flow_schema_uid.as_deref(), Some("fs-uid"));
}

#[tokio::test(start_paused = true)]
async fn a_5xx_with_retry_after_is_retried_and_one_without_is_not() {
    let fake = Fake::new(&[Answer(503, Some("1"))]);
    let (b, told) = budget("d", Limit::Unlimited);
    scoped(work(&b, Duration::from_secs(30)), fake.patch("va-1"))
        .await
        .expect("answered 200 on the retry");
    assert_eq!(fake.seen().len(), 2);
    // A 5xx is waited for but is no 429.
    assert_eq!(*told.too_many.lock(), 0);
    assert_eq!(*told.waited.lock(), Duration::from_secs(1));

    let fake = Fake::new(&[Answer(500, None)]);
    let e = scoped(work(&b, Duration::from_secs(30)), fake.patch("va-1"))
        .await
        .expect_err("a 500 without Retry-After is final");
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 500),
        "{e:?}"
    );
    assert_eq!(fake.seen().len(), 1);

    // A 429 without Retry-After, or with a date, is not retried either.
    for answer in [
        Answer(429, None),
        Answer(429, Some("Wed, 21 Oct 2026 07:28:00 GMT")),
    ] {
        let fake = Fake::new(&[answer]);
        scoped(work(&b, Duration::from_secs(30)), fake.patch("va-1"))
            .await
            .expect_err("final");
        assert_eq!(fake.seen().len(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn retries_stop_after_client_gos_ten() {
    let fake = Fake::new(&[Answer(429, Some("1")); 20]);
    let (b, told) = budget("d", Limit::Unlimited);
    let start = Instant::now();
    let e = scoped(work(&b, Duration::from_secs(300)), fake.patch("va-1"))
        .await
        .expect_err("still 429 after the last retry");
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 429),
        "{e:?}"
    );
    assert_eq!(fake.seen().len(), 1 + MAX_RETRIES as usize);
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert_eq!(*told.too_many.lock(), 11);

    // Without a scope (the shared watches) the same rules hold.
    let fake = Fake::new(&[Answer(429, Some("1")); 20]);
    fake.patch("va-1").await.expect_err("429");
    assert_eq!(fake.seen().len(), 11);
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_would_pass_the_deadline_is_not_waited() {
    let fake = Fake::new(&[Answer(429, Some("2")), Answer(429, Some("20"))]);
    let (b, told) = budget("d", Limit::Unlimited);
    let start = Instant::now();
    let e = scoped(work(&b, Duration::from_secs(10)), fake.patch("va-1"))
        .await
        .expect_err("the second wait ends beyond the deadline");
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 429),
        "{e:?}"
    );
    assert_eq!(fake.seen().len(), 2);
    // The first wait (2 s) was spent; the second (20 s) was not begun.
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(*told.waited.lock(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_retry_spends_the_drivers_budget_like_a_new_request() {
    let fake = Fake::new(&[Answer(429, Some("0"))]);
    let (b, _) = budget("d", Limit::Rate { qps: 1.0, burst: 1 });
    // The caller spends the first token (the writer does, before sending).
    b.acquire("PATCH", "va-1").await;
    let start = Instant::now();
    scoped(work(&b, Duration::from_secs(30)), fake.patch("va-1"))
        .await
        .expect("answered 200 on the retry");
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    // Retry-After 0, but the retry waited for the driver's next token.
    assert_eq!(seen[1].0 - start, Duration::from_secs(1));
}

/// One driver's 429 narrows its own window of work requests in flight, never its Lease calls,
/// never another driver's requests; the window widens with answers and opens when the
/// stretch ends.
#[tokio::test(start_paused = true)]
async fn a_429_narrows_the_drivers_window_but_not_its_lease_calls_nor_other_drivers() {
    let fake = Arc::new(Fake::new(&[Answer(429, Some("1")); 4]));
    fake.latency.store(100, Ordering::Relaxed);
    let (a, _) = budget("a", Limit::Unlimited);
    let (b, _) = budget("b", Limit::Unlimited);
    // Four of a's requests in flight are turned away at once: one narrowing, to 2.
    let first: Vec<_> = (0..4)
        .map(|i| {
            let (fake, a) = (fake.clone(), a.clone());
            tokio::spawn(async move {
                scoped(
                    work(&a, Duration::from_secs(30)),
                    fake.patch(&format!("va-{i}")),
                )
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let status = a.status().pushback;
    assert_eq!(status.too_many_requests, 4);
    assert_eq!(status.window, Some(2.0), "half of the 4 in flight, once");
    // Six more of a's, a Lease call of a's and six of b's, all at 150 ms.
    let start = Instant::now();
    let more: Vec<_> = (0..6)
        .map(|i| {
            let (fake, a) = (fake.clone(), a.clone());
            tokio::spawn(async move {
                scoped(
                    work(&a, Duration::from_secs(30)),
                    fake.patch(&format!("more-{i}")),
                )
                .await
            })
        })
        .collect();
    let others: Vec<_> = (0..6)
        .map(|i| {
            let (fake, b) = (fake.clone(), b.clone());
            tokio::spawn(async move {
                scoped(
                    work(&b, Duration::from_secs(30)),
                    fake.patch(&format!("other-{i}")),
                )
                .await
            })
        })
        .collect();
    scoped(
        Scope::new(
            a.clone(),
            Kind::Lease,
            Instant::now() + Duration::from_secs(10),
        ),
        fake.patch("lease-a"),
    )
    .await
    .expect("200");
    for t in more.into_iter().chain(others).chain(first) {
        t.await.expect("task").expect("200");
    }
    let sent_at = |prefix: &str| -> Vec<Duration> {
        fake.seen()
            .iter()
            .filter(|s| {
                s.2.rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .map(|s| s.0 - start)
            .collect()
    };
    assert_eq!(
        sent_at("lease-a"),
        [Duration::ZERO],
        "a Lease call never waits for room"
    );
    assert!(
        sent_at("other-").iter().all(|t| t.is_zero()),
        "b has a window of its own"
    );
    // a's six went out two at a time, 100 ms apart (the window widens by one a second at
    // most, and only while it is full).
    let mut more = sent_at("more-");
    more.sort();
    let ms = |m: u64| Duration::from_millis(m);
    assert_eq!(more, [ms(0), ms(0), ms(100), ms(100), ms(200), ms(200)]);
    // The stretch ends after a quiet spell; the window stays as it is until much later.
    tokio::time::sleep(STRETCH_QUIET).await;
    assert!(!a.status().pushback.throttled);
    // (Widened once: the first four's retries filled it a second after the narrowing.)
    assert_eq!(a.status().pushback.window, Some(3.0));
    tokio::time::sleep(WINDOW_REOPEN).await;
    scoped(work(&a, Duration::from_secs(30)), fake.patch("later"))
        .await
        .expect("200");
    // Long without a refusal: the window opens.
    tokio::time::sleep(STRETCH_QUIET).await;
    let status = a.status().pushback;
    assert!(!status.throttled);
    assert_eq!(status.window, None);
    assert_eq!(status.in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_window_widens_by_one_a_second_while_nothing_is_refused() {
    let fake = Arc::new(Fake::new(&[Answer(429, Some("0"))]));
    fake.latency.store(100, Ordering::Relaxed);
    let (a, _) = budget("a", Limit::Unlimited);
    scoped(work(&a, Duration::from_secs(30)), fake.patch("va-0"))
        .await
        .expect("200 on the retry");
    assert_eq!(a.status().pushback.window, Some(1.0));
    // Four workers keep the window full for 3.5 s.
    let start = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (fake, a) = (fake.clone(), a.clone());
            tokio::spawn(async move {
                while start.elapsed() < Duration::from_millis(3500) {
                    scoped(
                        work(&a, Duration::from_secs(30)),
                        fake.patch(&format!("w-{w}")),
                    )
                    .await
                    .expect("200");
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }
    // Narrowed at 0.1 s; widened at about 1.1, 2.1 and 3.1 s.
    assert_eq!(a.status().pushback.window, Some(4.0));
    // A window that is not full does not widen.
    tokio::time::sleep(Duration::from_secs(2)).await;
    scoped(work(&a, Duration::from_secs(30)), fake.patch("alone"))
        .await
        .expect("200");
    assert_eq!(a.status().pushback.window, Some(4.0));
}

#[tokio::test(start_paused = true)]
async fn a_dear_refusal_slows_the_widening_to_one_per_retry_after() {
    let fake = Arc::new(Fake::new(&[Answer(429, Some("3"))]));
    fake.latency.store(100, Ordering::Relaxed);
    let (a, _) = budget("a", Limit::Unlimited);
    // Narrowed at 0.1 s; the retry's answer at 3.2 s widens it (3 s since the narrowing).
    scoped(work(&a, Duration::from_secs(30)), fake.patch("va-0"))
        .await
        .expect("200 on the retry");
    assert_eq!(a.status().pushback.window, Some(2.0));
    // Full for 2.5 s more: a second widening would take 3 s.
    let start = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (fake, a) = (fake.clone(), a.clone());
            tokio::spawn(async move {
                while start.elapsed() < Duration::from_millis(2500) {
                    scoped(
                        work(&a, Duration::from_secs(30)),
                        fake.patch(&format!("w-{w}")),
                    )
                    .await
                    .expect("200");
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }
    assert_eq!(a.status().pushback.window, Some(2.0));
}

#[tokio::test(start_paused = true)]
async fn work_that_finds_no_room_before_its_deadline_fails_without_being_sent() {
    let fake = Arc::new(Fake::new(&[Answer(429, Some("0"))]));
    let (a, _) = budget("a", Limit::Unlimited);
    // Narrowed to one by a 429; the 200 of its retry comes within a second: still one.
    scoped(work(&a, Duration::from_secs(30)), fake.patch("va-1"))
        .await
        .expect("200");
    assert_eq!(a.status().pushback.window, Some(1.0));
    // A slow request takes the room; the next one's deadline passes while it waits.
    fake.latency.store(20_000, Ordering::Relaxed);
    let slow: Vec<_> = (0..1)
        .map(|i| {
            let (fake, a) = (fake.clone(), a.clone());
            tokio::spawn(async move {
                scoped(
                    work(&a, Duration::from_secs(30)),
                    fake.patch(&format!("slow-{i}")),
                )
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(a.status().pushback.in_flight, 1);
    let start = Instant::now();
    let e = scoped(work(&a, Duration::from_secs(5)), fake.patch("va-2"))
        .await
        .expect_err("no room before its deadline");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(
        e.to_string()
            .contains("no room before this request's deadline"),
        "{e}"
    );
    assert!(
        !fake.seen().iter().any(|s| s.2.ends_with("va-2")),
        "never sent"
    );
    for t in slow {
        t.await.expect("task").expect("200");
    }
}

#[tokio::test(start_paused = true)]
async fn a_throttled_stretch_ends_after_a_quiet_spell() {
    let fake = Fake::new(&[Answer(429, Some("1")), Answer(429, Some("1"))]);
    let (a, _) = budget("a", Limit::Unlimited);
    scoped(work(&a, Duration::from_secs(30)), fake.patch("va-1"))
        .await
        .expect("200");
    let s = a.status().pushback;
    assert!(s.throttled);
    assert_eq!(s.too_many_requests, 2);
    assert_eq!(s.throttled_seconds, Some(2.0));
    tokio::time::sleep(STRETCH_QUIET).await;
    let s = a.status().pushback;
    assert!(!s.throttled, "quiet for {STRETCH_QUIET:?}");
    assert_eq!(s.throttled_seconds, None);
    assert_eq!(s.too_many_requests, 2, "the count stays");
    // A new 429 starts a new stretch.
    let fake = Fake::new(&[Answer(429, Some("1"))]);
    scoped(work(&a, Duration::from_secs(30)), fake.patch("va-1"))
        .await
        .expect("200");
    let s = a.status().pushback;
    assert!(s.throttled);
    assert_eq!(s.throttled_seconds, Some(1.0));
}

/// A `tracing` writer appending to a shared buffer, for the log lines of a stretch.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The captured lines that contain `text`.
    fn lines_with(&self, text: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock())
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn a_throttled_stretch_is_logged_once_when_it_starts_and_once_when_it_ends() {
    const START: &str = "the API server is throttling this driver's requests";
    const END: &str = "the API server no longer throttles this driver's requests";
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let fake = Fake::new(&[Answer(429, Some("1")), Answer(429, Some("2"))]);
    let (a, _) = budget("a", Limit::Unlimited);
    scoped(work(&a, Duration::from_secs(30)), fake.patch("va-1"))
        .await
        .expect("200");
    let started = captured.lines_with(START);
    assert_eq!(started.len(), 1, "two 429s, one stretch: {started:?}");
    for field in [
        "driver=a",
        "priority_level_uid=\"pl-uid\"",
        "flow_schema_uid=\"fs-uid\"",
        "request=\"work\"",
    ] {
        assert!(started[0].contains(field), "{field} in {}", started[0]);
    }
    assert!(captured.lines_with(END).is_empty(), "not over yet");

    // Not yet quiet long enough: a read of the status does not end it.
    tokio::time::sleep(STRETCH_QUIET / 2).await;
    let _ = a.status();
    assert!(
        captured.lines_with(END).is_empty(),
        "quiet for only half of {STRETCH_QUIET:?}"
    );

    tokio::time::sleep(STRETCH_QUIET).await;
    let _ = a.status();
    let ended = captured.lines_with(END);
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert!(ended[0].contains("driver=a"), "{}", ended[0]);
    assert!(ended[0].contains("too_many_requests=2"), "{}", ended[0]);

    // Later reads log nothing more; the next 429 starts (and logs) a new stretch.
    let _ = a.status();
    assert_eq!(captured.lines_with(END).len(), 1);
    let fake = Fake::new(&[Answer(429, Some("1"))]);
    scoped(work(&a, Duration::from_secs(30)), fake.patch("va-2"))
        .await
        .expect("200");
    assert_eq!(captured.lines_with(START).len(), 2);
}
