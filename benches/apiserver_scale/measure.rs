//! What the scale bench reads: `/proc/<pid>` (RSS, CPU) and the API server's
//! `apiserver_request_total`.

use std::collections::BTreeMap;

/// One reading of a process: resident set, its peak, and CPU time (user + system).
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcSample {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub cpu_ticks: u64,
}

impl ProcSample {
    pub fn read(pid: u32) -> ProcSample {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields after the command name (which may hold spaces) start at field 3 (state);
        // utime and stime are fields 14 and 15.
        let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = after.split_whitespace().collect();
        let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        ProcSample {
            rss_kib: kib("VmRSS:"),
            hwm_kib: kib("VmHWM:"),
            cpu_ticks: tick(11) + tick(12),
        }
    }

    /// CPU seconds since `before`.
    pub fn cpu_secs(&self, before: &ProcSample) -> f64 {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        self.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 / hz
    }
}

/// `apiserver_request_total` summed by "VERB group/resource[/subresource]" (codes, scopes and
/// versions added up). Non-resource requests (`/metrics` itself) are left out.
#[derive(Clone, Debug, Default)]
pub struct ApiCounts(BTreeMap<String, f64>);

impl ApiCounts {
    pub async fn scrape(client: &kube::Client) -> ApiCounts {
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("request");
        let text = client.request_text(req).await.expect("GET /metrics");
        ApiCounts::parse(&text)
    }

    pub fn parse(text: &str) -> ApiCounts {
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let mut l = BTreeMap::new();
            for kv in labels.split("\",") {
                if let Some((k, v)) = kv.split_once("=\"") {
                    l.insert(k.trim(), v.trim_end_matches('"'));
                }
            }
            let get = |k: &str| l.get(k).copied().unwrap_or("");
            if get("resource").is_empty() {
                continue;
            }
            let group = match get("group") {
                "" => String::new(),
                g => format!("{g}/"),
            };
            let sub = match get("subresource") {
                "" => String::new(),
                s => format!("/{s}"),
            };
            let key = format!("{} {group}{}{sub}", get("verb"), get("resource"));
            *out.entry(key).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
        }
        ApiCounts(out)
    }

    pub fn minus(&self, before: &ApiCounts) -> ApiCounts {
        ApiCounts(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0)))
                .collect(),
        )
    }

    /// Less `baseline × scale`, never below zero.
    pub fn less_scaled(&self, baseline: &ApiCounts, scale: f64) -> ApiCounts {
        ApiCounts(
            self.0
                .iter()
                .map(|(k, v)| {
                    let b = baseline.0.get(k).copied().unwrap_or(0.0) * scale;
                    (k.clone(), (v - b).max(0.0))
                })
                .collect(),
        )
    }

    pub fn by_key(&self) -> BTreeMap<String, f64> {
        self.0.clone()
    }

    pub fn total(&self) -> f64 {
        self.0.values().sum()
    }

    pub fn verb_total(&self, verb: &str) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| k.split(' ').next() == Some(verb))
            .map(|(_, v)| v)
            .sum()
    }

    /// Every verb on `group/resource` (subresources included).
    pub fn resource_total(&self, resource: &str) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| {
                k.split_once(' ')
                    .is_some_and(|(_, r)| r == resource || r.starts_with(&format!("{resource}/")))
            })
            .map(|(_, v)| v)
            .sum()
    }
}
