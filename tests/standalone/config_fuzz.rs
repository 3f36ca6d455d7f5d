//! A seeded property test ("fuzzer") of the two parsers of user input: thousands of mutated
//! `drivers.yaml` files and random command lines. Each input must give `Ok` with every value
//! within its documented bound, or an error naming the file, a line and a column (flags: an
//! exit code); never a panic, and never more than [`PER_SMALL_INPUT`] of time for a small
//! input ([`PER_LARGE_INPUT`] for one of up to a few MiB).
//!
//! The inputs are the same on every run (seed [`SEED`]), so a failure reproduces. For a longer
//! run with other inputs, set `CONFIG_FUZZ_SEED` (any number) and `CONFIG_FUZZ_CASES`:
//!
//! ```sh
//! CONFIG_FUZZ_SEED=$RANDOM CONFIG_FUZZ_CASES=200000 cargo test --release --test standalone config_fuzz:: -- --nocapture
//! ```
//!
//! A failing input is written to `target/tmp/config-fuzz-failure-<n>.yaml` and its case
//! number printed with the seed.

use std::{
    panic::{self, AssertUnwindSafe},
    sync::Arc,
    time::{Duration, Instant},
};

use attacher_hub::{
    cli::{self, Args, Parsed},
    config::{self, Defaults},
    k8s::budget::Limit,
};

/// The default seed: any fixed number gives the same inputs on every run.
const SEED: u64 = 0x5eed_c0f1_6d21_7e55;

/// Mutated driver lists per run: 15 to 25 s in a debug build on the shared two-core machine,
/// about 40 s with both cores kept busy.
const FILE_CASES: usize = 3_000;

/// Random command lines per run (each parses in microseconds).
const FLAG_CASES: usize = 20_000;

/// Longest an input of at most [`SMALL_INPUT`] bytes may take. Such an input parses in a few
/// milliseconds in a debug build; a hang or a quadratic blow-up takes far longer, and a busy
/// machine does not make milliseconds into seconds.
const PER_SMALL_INPUT: Duration = Duration::from_secs(2);

/// What a small input is.
const SMALL_INPUT: usize = 64 << 10;

/// Longest a larger input (up to a few MiB: a number of a million digits, a file past
/// `MAX_FILE_BYTES`, thousands of duplicated lines) may take; the slowest parse in about 0.1 s.
const PER_LARGE_INPUT: Duration = Duration::from_secs(10);

/// The name the parser gives the file in its errors.
const LABEL: &str = "drivers.yaml";

// === a small deterministic generator (SplitMix64) ===

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// `true` with probability `1/n`.
    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A random Unicode scalar value: mostly ASCII, then other planes and the awkward ones.
    fn char(&mut self) -> char {
        let code = match self.below(6) {
            0 => self.below(0x80) as u32,
            1 => self.below(0x800) as u32,
            2 => self.below(0x1_0000) as u32,
            3 => self.below(0x11_0000) as u32,
            4 => *self.pick(&[
                0x0, 0x85, 0xa0, 0x2028, 0x2029, 0xfeff, 0xfffd, 0xfffe, 0x1f600,
            ]),
            _ => self.below(0x20) as u32,
        };
        char::from_u32(code).unwrap_or('\u{fffd}')
    }
}

fn seed_from_env() -> u64 {
    std::env::var("CONFIG_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEED)
}

fn cases_from_env(default: usize) -> usize {
    std::env::var("CONFIG_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

// === the seeds ===

/// Valid driver lists the mutations start from: the example, flow style, anchors and aliases,
/// the smallest, and one at several bounds at once.
fn seeds() -> Vec<Vec<u8>> {
    let example = include_str!("../../drivers.example.yaml");
    let others = [
        "drivers:\n- address: /a\n",
        "hubKubeApiQps: 50\nhubKubeApiBurst: 60\ndrivers: [{address: unix:///csi/a.sock, name: a.example.com, timeout: 30s, workerThreads: {attach: 4, detach: 2}, retryIntervalStart: 500ms, retryIntervalMax: 1m, reconcileSync: 2m, maxEntries: 100, defaultFstype: xfs, kubeApiQps: 2.5, kubeApiBurst: 7, leaderElection: {namespace: storage, leaseDuration: 30s, renewDeadline: 20s, retryPeriod: 4s, labels: {team: storage}}}, {address: /csi/b.sock, leaderElection: false}]\n",
        "drivers:\n  - &first\n    address: /csi/a.sock\n    leaderElection: &le\n      namespace: storage\n      leaseDuration: 30s\n      labels: &labels {team: storage, tier: gold}\n    workerThreads: &w {attach: 4, detach: 2}\n  - address: /csi/b.sock\n    leaderElection: *le\n    workerThreads: *w\n  - <<: *first\n    address: /csi/c.sock\n    name: c.example.com\n",
        "# bounds\nhubKubeApiQps: 1000000\nhubKubeApiBurst: 2000000\ndrivers:\n- address: /a\n  timeout: 24h\n  workerThreads: 10000\n  retryIntervalStart: 24h\n  retryIntervalMax: 24h\n  reconcileSync: 24h\n  maxEntries: 2147483647\n  kubeApiQps: 1e6\n  kubeApiBurst: 2000000\n  leaderElection: {leaseDuration: 24h, renewDeadline: 20h, retryPeriod: 1s}\n- address: /b\n  kubeApiQps: -.inf\n",
        "\u{feff}drivers:\r\n- address: '/csi/quoted path.sock'\r\n  name: \"caf\\u00e9.example.com\"\r\n  defaultFstype: ''\r\n",
    ];
    std::iter::once(example)
        .chain(others)
        .map(|s| s.as_bytes().to_vec())
        .collect()
}

// === mutations ===

/// Bytes that YAML or UTF-8 treat specially.
const INTERESTING_BYTES: &[&[u8]] = &[
    b"\0",
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\xed\xa0\x80", // an encoded surrogate: not UTF-8
    b"\xef\xbb\xbf", // BOM
    b"\xc2\x85",     // NEL
    b"\xe2\x80\xa8", // LINE SEPARATOR
    b"\t",
    b"\r",
    b"\n",
    b"\r\n",
    b" ",
    b"&a ",
    b"*a",
    b"<<: *a\n",
    b"!!str ",
    b"!!binary ",
    b"!custom ",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b": ",
    b"- ",
    b"? ",
    b"#",
    b"'",
    b"\"",
    b"\\",
    b"|\n",
    b">-\n",
    b"%YAML 1.2\n---\n",
    b"---\n",
    b"...\n",
    b"~",
];

/// Values to put where a value was.
const INTERESTING_VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "10000",
    "10001",
    "1000000000",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551616",
    "-9223372036854775809",
    "0x7fffffff",
    "0o777",
    "0b101",
    "1_000",
    "1e6",
    "1000001",
    "2000001",
    "1e308",
    "1e999",
    "-1e999",
    ".inf",
    "-.inf",
    ".nan",
    "2147483647",
    "2147483648",
    "4294967296",
    "24h",
    "24h0m0.000000001s",
    "25h",
    "2562047h",
    "2562048h",
    "-5s",
    "0s",
    "1ns",
    "999ms",
    "1.5h",
    "15",
    "",
    "~",
    "null",
    "true",
    "no",
    "[]",
    "{}",
    "[1, 2]",
    "{attach: 1, detach: 1}",
    "{attach: 10001, detach: 1}",
    "{attach: 1}",
    "*undefined",
    "&a x",
    "!!binary aGVsbG8=",
    "!!int 3",
    "!!float 1",
    "!!str 5",
    "unix:///csi/a.sock",
    "tcp://1.2.3.4:5",
    "\"\\0\"",
    "\"\\uD800\"",
    "'it''s'",
];

/// Values at and just past each bound, by the key they are written for.
const BOUNDARY_VALUES: &[(&[&str], &[&str])] = &[
    (
        &[
            "timeout",
            "retryIntervalStart",
            "retryIntervalMax",
            "reconcileSync",
            "leaseDuration",
            "renewDeadline",
            "retryPeriod",
        ],
        &[
            "24h",
            "86400s",
            "1440m",
            "24h0m0.000000001s",
            "24h1s",
            "25h",
            "2562047h",
            "1ns",
            "0s",
            "-1s",
            "999ms",
            "1s",
            "1.5s",
        ],
    ),
    (
        &["workerThreads", "attach", "detach"],
        &[
            "1",
            "10000",
            "10001",
            "0",
            "-1",
            "4294967296",
            "1000000000",
            "{attach: 10000, detach: 10000}",
            "{attach: 10001, detach: 1}",
            "{attach: 1, detach: 10001}",
        ],
    ),
    (
        &["maxEntries"],
        &["0", "2147483647", "2147483648", "-1", "4294967295"],
    ),
    (
        &["kubeApiQps", "hubKubeApiQps"],
        &[
            "1e6",
            "1000000",
            "1000000.1",
            "1e7",
            ".inf",
            "-.inf",
            ".nan",
            "0",
            "-1",
            "1e-300",
        ],
    ),
    (
        &["kubeApiBurst", "hubKubeApiBurst"],
        &["2000000", "2000001", "0", "-1", "1", "4294967296"],
    ),
];

/// A random line written as `key: value` (not a comment): its range, and where the value
/// starts.
fn random_value_line(rng: &mut Rng, input: &[u8]) -> Option<(usize, usize, usize)> {
    let starts = line_starts(input);
    let lines: Vec<(usize, usize, usize)> = starts
        .iter()
        .enumerate()
        .filter_map(|(i, &start)| {
            let end = starts.get(i + 1).map_or(input.len(), |next| next - 1);
            let line = &input[start..end.max(start)];
            let text = line
                .iter()
                .skip_while(|b| **b == b' ')
                .copied()
                .collect::<Vec<_>>();
            if text.first() == Some(&b'#') {
                return None;
            }
            let colon = line.windows(2).position(|w| w == b": ")?;
            Some((start, end, start + colon + 2))
        })
        .collect();
    (!lines.is_empty()).then(|| lines[rng.below(lines.len())])
}

/// The key of a `key: value` line (after any `- `).
fn key_of(input: &[u8], start: usize, value: usize) -> String {
    String::from_utf8_lossy(&input[start..value - 2])
        .trim_start_matches([' ', '-'])
        .to_owned()
}

/// Where the lines of `input` start, and the end.
fn line_starts(input: &[u8]) -> Vec<usize> {
    let mut starts = vec![0];
    starts.extend(
        input
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .map(|(i, _)| i + 1),
    );
    starts
}

/// The byte range of a random line (without its `\n`).
fn random_line(rng: &mut Rng, input: &[u8]) -> (usize, usize) {
    let starts = line_starts(input);
    let i = rng.below(starts.len());
    let start = starts[i];
    let end = starts.get(i + 1).map_or(input.len(), |next| next - 1);
    (start, end.max(start))
}

/// A value that nests `depth` collections.
fn nested(rng: &mut Rng, depth: usize) -> String {
    match rng.below(3) {
        0 => format!("{}1{}", "[".repeat(depth), "]".repeat(depth)),
        1 => format!("{}1{}", "{a: ".repeat(depth), "}".repeat(depth)),
        _ => {
            // Block nesting grows with the square of the depth: keep it under a megabyte.
            let mut s = String::new();
            for i in 0..depth.min(1_000) {
                s.push('\n');
                s.push_str(&" ".repeat(i + 4));
                s.push_str("- ");
            }
            s.push('1');
            s
        }
    }
}

/// A "billion laughs" block: `levels` anchors, each aliasing the previous one `width` times.
fn alias_bomb(indent: usize, levels: usize, width: usize) -> String {
    let pad = " ".repeat(indent);
    let mut s = format!("{pad}l0: &l0 [{}]\n", vec!["lol"; width].join(","));
    for i in 1..levels {
        let items = vec![format!("*l{}", i - 1); width].join(",");
        s.push_str(&format!("{pad}l{i}: &l{i} [{items}]\n"));
    }
    s
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    let len = input.len();
    match rng.below(18) {
        // Flip a bit.
        0 if len > 0 => {
            let at = rng.below(len);
            input[at] ^= 1 << rng.below(8);
        }
        // Overwrite a byte.
        1 if len > 0 => {
            let at = rng.below(len);
            input[at] = rng.below(256) as u8;
        }
        // Insert special bytes.
        2 => {
            let at = rng.below(len + 1);
            let bytes = *rng.pick(INTERESTING_BYTES);
            input.splice(at..at, bytes.iter().copied());
        }
        // Insert random Unicode.
        3 => {
            let at = rng.below(len + 1);
            let text: String = (0..1 + rng.below(8)).map(|_| rng.char()).collect();
            input.splice(at..at, text.into_bytes());
        }
        // Truncate.
        4 => input.truncate(rng.below(len + 1)),
        // Delete a line.
        5 => {
            let (start, end) = random_line(rng, input);
            input.drain(start..(end + 1).min(input.len()));
        }
        // Duplicate a line, usually once, sometimes thousands of times.
        6 => {
            let (start, end) = random_line(rng, input);
            let mut line = input[start..end].to_vec();
            line.push(b'\n');
            let times = if rng.one_in(20) {
                1 + rng.below(3_000)
            } else {
                1 + rng.below(3)
            };
            let block = line.repeat(times);
            let at = rng.below(line_starts(input).len());
            let at = line_starts(input)[at];
            input.splice(at..at, block);
        }
        // Swap two lines.
        7 => {
            let text = String::from_utf8_lossy(input).into_owned();
            let mut lines: Vec<&str> = text.split('\n').collect();
            let (a, b) = (rng.below(lines.len()), rng.below(lines.len()));
            lines.swap(a, b);
            *input = lines.join("\n").into_bytes();
        }
        // Indent or dedent a line.
        8 => {
            let (start, _) = random_line(rng, input);
            if rng.one_in(2) {
                let n = 1 + rng.below(4);
                input.splice(start..start, std::iter::repeat_n(b' ', n));
            } else {
                let spaces = input[start..].iter().take_while(|b| **b == b' ').count();
                input.drain(start..start + spaces.min(1 + rng.below(4)));
            }
        }
        // Replace a value with a special one.
        9 => {
            if let Some((_, end, value)) = random_value_line(rng, input) {
                let text = *rng.pick(INTERESTING_VALUES);
                input.splice(value..end, text.bytes());
            }
        }
        // Put a value at or just past the bound of its key (most often: the bounds are what
        // this test is about).
        10 | 16 | 17 => {
            if let Some((start, end, value)) = random_value_line(rng, input) {
                let key = key_of(input, start, value);
                let values = BOUNDARY_VALUES
                    .iter()
                    .find(|(keys, _)| keys.contains(&key.as_str()))
                    .map_or(INTERESTING_VALUES, |(_, values)| values);
                let text = *rng.pick(values);
                input.splice(value..end, text.bytes());
            }
        }
        // Replace a value with a huge number.
        11 => {
            if let Some((_, end, value)) = random_value_line(rng, input) {
                let digits = match rng.below(10) {
                    0 => 1_000_000,
                    1..=3 => 1 + rng.below(10_000),
                    _ => 15 + rng.below(30),
                };
                let mut number = "9".repeat(digits);
                if rng.one_in(3) {
                    number.insert(0, '-');
                }
                if rng.one_in(3) {
                    let suffix = rng.pick(&["h", "s", "ms", ".5", "e9"]);
                    number.push_str(suffix);
                }
                input.splice(value..end, number.into_bytes());
            }
        }
        // Nest a value deeply.
        12 => {
            if let Some((_, end, at)) = random_value_line(rng, input) {
                let depth = match rng.below(4) {
                    0 => 10_000,
                    _ => 1 + rng.below(40),
                };
                let value = nested(rng, depth);
                input.splice(at..end, value.into_bytes());
            }
        }
        // Add anchors and aliases, up to a "billion laughs".
        13 => {
            let (start, _) = random_line(rng, input);
            let indent = input[start..].iter().take_while(|b| **b == b' ').count();
            let bomb = if rng.one_in(2) {
                alias_bomb(indent, 2 + rng.below(9), 2 + rng.below(9))
            } else {
                format!(
                    "{}x: {}\n",
                    " ".repeat(indent),
                    rng.pick(&["*l0", "&l0 a", "*l0 *l0", "&x [*x]", "<<: *x", "&a &b c"])
                )
            };
            input.splice(start..start, bomb.into_bytes());
        }
        // A line from another seed.
        14 => {
            let other = rng.pick(seeds);
            let (start, end) = random_line(rng, other);
            let mut line = other[start..end].to_vec();
            line.push(b'\n');
            let at = line_starts(input)[rng.below(line_starts(input).len())];
            input.splice(at..at, line);
        }
        // Longer than the file bound: a huge line or number.
        _ if rng.one_in(8) => {
            let at = rng.below(len + 1);
            let fill = *rng.pick(b"9x #");
            let n = config::MAX_FILE_BYTES + 1 - len.min(config::MAX_FILE_BYTES);
            input.splice(at..at, std::iter::repeat_n(fill, n));
        }
        _ => {
            let at = rng.below(len + 1);
            input.splice(at..at, b"\xc3(".iter().copied());
        }
    }
}

// === the properties ===

/// What one parse gave, as far as the properties care.
enum Outcome {
    Ok(config::Config),
    Err(String),
    Panic(String),
}

fn parse(input: &[u8], defaults: &Defaults, discovery: bool) -> Outcome {
    match panic::catch_unwind(AssertUnwindSafe(|| {
        config::parse_bytes(input, LABEL, defaults, discovery)
    })) {
        Ok(Ok(c)) => Outcome::Ok(c),
        Ok(Err(e)) => Outcome::Err(e.to_string()),
        Err(payload) => Outcome::Panic(
            payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default(),
        ),
    }
}

/// Every value of an accepted file is within its bound.
fn check_bounds(c: &config::Config) -> Result<(), String> {
    let fail = |what: String| Err(what);
    if c.drivers.len() > config::MAX_DRIVERS {
        return fail(format!("{} drivers", c.drivers.len()));
    }
    let limit_ok = |l: &Limit| match *l {
        Limit::Unlimited => true,
        Limit::Rate { qps, burst } => {
            qps > 0.0 && qps <= cli::MAX_API_QPS && i64::from(burst) <= cli::MAX_API_BURST
        }
    };
    if !limit_ok(&c.hub_api_cap) {
        return fail(format!("hub cap {:?}", c.hub_api_cap));
    }
    let mut total = 0u64;
    for (i, d) in c.drivers.iter().enumerate() {
        let workers = [d.attach_workers, d.detach_workers];
        if workers
            .iter()
            .any(|w| *w == 0 || *w as u64 > cli::MAX_WORKERS)
        {
            return fail(format!("drivers[{i}] workers {workers:?}"));
        }
        total += 2 * d.attach_workers as u64 + d.detach_workers as u64;
        let mut durations = vec![
            d.timeout,
            d.retry_interval_start,
            d.retry_interval_max,
            d.reconcile_sync,
        ];
        if let Some(le) = &d.leader_election {
            durations.extend([le.lease_duration, le.renew_deadline, le.retry_period]);
            if le.lease_duration < cli::MIN_LEASE_DURATION || le.lease_duration <= le.renew_deadline
            {
                return fail(format!("drivers[{i}] leader election {le:?}"));
            }
        }
        if durations
            .iter()
            .any(|d| d.is_zero() || *d > cli::MAX_DURATION)
        {
            return fail(format!("drivers[{i}] durations {durations:?}"));
        }
        // A retry maximum below the start is fine (cli::rules): every retry waits the maximum.
        if d.max_entries < 0 {
            return fail(format!("drivers[{i}] maxEntries {}", d.max_entries));
        }
        if !limit_ok(&d.api_budget) {
            return fail(format!("drivers[{i}] budget {:?}", d.api_budget));
        }
    }
    if total > config::MAX_HUB_WORKERS {
        return fail(format!("{total} workers"));
    }
    Ok(())
}

/// An error names the file, a line of the input (or the one after its end) and a column, and
/// is one line.
fn check_error(input: &[u8], text: &str) -> Result<(), String> {
    let rest = text
        .strip_prefix(LABEL)
        .and_then(|r| r.strip_prefix(':'))
        .ok_or("does not start with the file name")?;
    let mut parts = rest.splitn(3, ':');
    let line: u64 = parts
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or("no line number")?;
    let column: u64 = parts
        .next()
        .and_then(|c| c.parse().ok())
        .ok_or("no column number")?;
    let message = parts.next().ok_or("no message")?;
    // Counts line breaks until there are enough for `line` (inputs reach megabytes).
    let mut lines = 1;
    let mut i = 0;
    while lines < line && i < input.len() {
        let b = input[i];
        if b == b'\n' || (b == b'\r' && input.get(i + 1) != Some(&b'\n')) {
            lines += 1;
        }
        i += 1;
    }
    if line == 0 || line > lines {
        return Err(format!("line {line} of an input with {lines} lines"));
    }
    if column == 0 {
        return Err("column 0".to_owned());
    }
    if !message.starts_with(' ') || message.trim().is_empty() {
        return Err("no message after the position".to_owned());
    }
    if text.contains(['\n', '\r']) {
        return Err("more than one line".to_owned());
    }
    Ok(())
}

/// Writes a failing input where it can be read back, and says how to find it.
fn report(failures: &mut Vec<String>, case: usize, input: &[u8], seed: u64, problem: &str) {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("config-fuzz-failure-{case}.yaml"));
    let _ = std::fs::write(&path, input);
    let shown: String = String::from_utf8_lossy(&input[..input.len().min(300)]).into_owned();
    failures.push(format!(
        "case {case} (seed {seed}): {problem}\n  input ({} bytes, in {}): {shown:?}",
        input.len(),
        path.display()
    ));
}

/// What the fuzzing thread is parsing now: case number, start, time limit and input.
type Current = std::sync::Mutex<Option<(usize, Instant, Duration, Arc<Vec<u8>>)>>;

/// What a run found.
#[derive(Default)]
struct Findings {
    accepted: usize,
    refused: usize,
    parsing: Duration,
    slowest: (Duration, usize),
    failures: Vec<String>,
}

/// Generates and checks `cases` inputs; publishes each input in `current` while it is parsed.
fn fuzz_files(seed: u64, cases: usize, current: &Current) -> Findings {
    let seeds = seeds();
    let defaults = Defaults::with_identity(&Args::default(), "fuzz".to_owned());
    for (i, s) in seeds.iter().enumerate() {
        match parse(s, &defaults, false) {
            Outcome::Ok(c) => check_bounds(&c).unwrap_or_else(|e| panic!("seed {i}: {e}")),
            Outcome::Err(e) | Outcome::Panic(e) => {
                panic!("seed {i} is not a valid driver list: {e}")
            }
        }
    }
    let mut rng = Rng(seed);
    let mut found = Findings::default();
    for case in 0..cases {
        let mut input = rng.pick(&seeds).clone();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut input, &seeds);
            // Further mutations of a large input cost more than they find.
            if input.len() > SMALL_INPUT {
                break;
            }
        }
        let discovery = rng.one_in(4);
        let limit = if input.len() <= SMALL_INPUT {
            PER_SMALL_INPUT
        } else {
            PER_LARGE_INPUT
        };
        let input = Arc::new(input);
        let started = Instant::now();
        *lock(current) = Some((case, started, limit, input.clone()));
        let outcome = parse(&input, &defaults, discovery);
        let took = started.elapsed();
        *lock(current) = None;
        found.parsing += took;
        if took > found.slowest.0 {
            found.slowest = (took, input.len());
        }
        let problem = match outcome {
            Outcome::Ok(c) => {
                found.accepted += 1;
                check_bounds(&c)
                    .err()
                    .map(|e| format!("accepted out of bounds: {e}"))
            }
            Outcome::Err(text) => {
                found.refused += 1;
                check_error(&input, &text)
                    .err()
                    .map(|e| format!("{e}: {text:?}"))
            }
            Outcome::Panic(message) => Some(format!("panicked: {message}")),
        };
        // A slow parse that finished is a failure too (the watchdog only sees hangs).
        let problem = problem.or_else(|| (took > limit).then(|| format!("took {took:?}")));
        if let Some(problem) = problem {
            report(&mut found.failures, case, &input, seed, &problem);
        }
        if found.failures.len() >= 20 {
            break;
        }
    }
    found
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn mutated_driver_lists_parse_or_fail_with_a_position_never_panic_and_never_hang() {
    let seed = seed_from_env();
    let cases = cases_from_env(FILE_CASES);
    let current: Arc<Current> = Arc::default();
    // The inputs are parsed on their own thread, watched from here, so that a hang is a
    // failure rather than a stuck test.
    let fuzzer = {
        let current = current.clone();
        std::thread::spawn(move || fuzz_files(seed, cases, &current))
    };
    let started = Instant::now();
    while !fuzzer.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
        if let Some((case, since, limit, input)) = lock(&current).clone()
            && since.elapsed() > limit
        {
            let mut failures = Vec::new();
            let problem = format!("no result within {limit:?}");
            report(&mut failures, case, &input, seed, &problem);
            panic!("\n{}", failures.join("\n"));
        }
    }
    let found = match fuzzer.join() {
        Ok(found) => found,
        Err(panic) => panic::resume_unwind(panic),
    };
    println!(
        "{cases} mutated driver lists (seed {seed}) in {:?} ({:?} parsing): {} accepted, {} refused; slowest {:?} ({} bytes)",
        started.elapsed(),
        found.parsing,
        found.accepted,
        found.refused,
        found.slowest.0,
        found.slowest.1
    );
    assert!(found.failures.is_empty(), "\n{}", found.failures.join("\n"));
    // The mutations must reach the checks behind the syntax, not only break the YAML.
    assert!(
        found.accepted * 50 >= cases && found.refused * 2 >= cases,
        "{} accepted, {} refused: the mutations no longer exercise both paths",
        found.accepted,
        found.refused
    );
}

// === the command line ===

/// Flags whose values are numbers, and values to give them.
const NUMERIC_FLAGS: &[&str] = &[
    "worker-threads",
    "max-entries",
    "max-grpc-log-length",
    "kube-api-qps",
    "kube-api-burst",
    "hub-kube-api-qps",
    "hub-kube-api-burst",
    "timeout",
    "resync",
    "retry-interval-start",
    "retry-interval-max",
    "reconcile-sync",
    "graceful-shutdown-timeout",
    "log-flush-frequency",
    "leader-election-lease-duration",
    "leader-election-renew-deadline",
    "leader-election-retry-period",
    "v",
];

fn random_value(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => rng.pick(INTERESTING_VALUES).to_string(),
        1 => (rng.next() >> rng.below(64)).to_string(),
        2 => format!(
            "{}{}",
            rng.next() >> rng.below(64),
            rng.pick(&["ns", "us", "ms", "s", "m", "h", "", "x"])
        ),
        _ => (0..rng.below(6)).map(|_| rng.char()).collect(),
    }
}

#[test]
fn random_command_lines_parse_or_fail_with_an_exit_code_never_panic() {
    let seed = seed_from_env();
    let cases = cases_from_env(FLAG_CASES);
    let mut rng = Rng(seed ^ 0xf1a9);
    let mut failures = Vec::new();
    let started = Instant::now();
    for case in 0..cases {
        let mut argv = vec!["attacher-hub".to_owned()];
        for _ in 0..1 + rng.below(4) {
            let flag = rng.pick(NUMERIC_FLAGS);
            let dashes = if rng.one_in(2) { "-" } else { "--" };
            argv.push(format!("{dashes}{flag}={}", random_value(&mut rng)));
        }
        if rng.one_in(3) {
            argv.push("--leader-election".to_owned());
        }
        let outcome = panic::catch_unwind(|| cli::parse_from(argv.clone()));
        let problem = match outcome {
            Err(_) => Some("panicked".to_owned()),
            Ok(Err(e)) if ![1, 2].contains(&e.exit_code()) => {
                Some(format!("exit code {}", e.exit_code()))
            }
            Ok(Err(_)) | Ok(Ok(Parsed::Exit { .. })) => None,
            Ok(Ok(Parsed::Run(args, _))) => {
                let le = &args.leader_election;
                let durations = [
                    args.resync,
                    args.timeout,
                    args.retry_interval_start,
                    args.retry_interval_max,
                    args.reconcile_sync,
                    args.graceful_shutdown_timeout,
                    args.logging.flush_frequency,
                    le.lease_duration,
                    le.renew_deadline,
                    le.retry_period,
                ];
                // The per-driver pauses, by the rule a drivers.yaml entry is held to.
                let pauses = [
                    args.timeout,
                    args.retry_interval_start,
                    args.retry_interval_max,
                    args.reconcile_sync,
                ];
                let ok = durations.iter().all(|d| *d <= cli::MAX_DURATION)
                    && pauses.iter().all(|d| !d.is_zero())
                    && args.worker_threads >= 1
                    && args.worker_threads as u64 <= cli::MAX_WORKERS
                    && (0..=cli::MAX_LIST_ENTRIES).contains(&args.max_entries)
                    && args.max_grpc_log_length <= cli::MAX_GRPC_LOG_LENGTH
                    && args.kube_api_qps <= cli::MAX_API_QPS
                    && (0.0..=cli::MAX_API_QPS).contains(&args.hub_kube_api_qps)
                    && (0..=cli::MAX_API_BURST).contains(&args.kube_api_burst)
                    && (0..=cli::MAX_API_BURST).contains(&args.hub_kube_api_burst)
                    && (!le.enabled || le.lease_duration >= cli::MIN_LEASE_DURATION);
                (!ok).then(|| format!("accepted out of bounds: {args:?}"))
            }
        };
        if let Some(problem) = problem {
            failures.push(format!("case {case} (seed {seed}): {argv:?}: {problem}"));
        }
    }
    println!(
        "{cases} random command lines (seed {seed}) in {:?}",
        started.elapsed()
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
