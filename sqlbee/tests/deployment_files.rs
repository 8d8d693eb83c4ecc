//! The deployment files in `docker/` agree with each other and with the
//! agent: systemd accepts the units, and the compose file, the Kubernetes
//! manifests, the docs and `privileges::KEPT` name the same capabilities,
//! images and limits. No root needed.
mod common;

use std::process::Command;

use common::{agent_capabilities, docker, lists};

fn values(text: &str, key: &str) -> Vec<String> {
    text.lines().filter_map(|l| l.trim().strip_prefix(key)).map(|v| v.trim().trim_matches('"').to_string()).collect()
}

#[test]
fn systemd_accepts_the_units() {
    let dir = std::env::temp_dir().join(format!("sqlbee-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let binary = env!("CARGO_BIN_EXE_sqlbee");
    let mut units = Vec::new();
    for unit in ["sqlbee-agent.service", "sqlbee-collector.service"] {
        // verify checks that ExecStart's binary exists: point it at this build.
        let text = docker(&format!("systemd/{unit}")).replace("/usr/local/bin/sqlbee", binary);
        std::fs::write(dir.join(unit), text).unwrap();
        units.push(dir.join(unit));
    }
    let out = Command::new("systemd-analyze").arg("verify").args(&units).output().expect("systemd-analyze (systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("sqlbee")).collect();
    assert!(out.status.success() && ours.is_empty(), "systemd-analyze verify:\n{stderr}");
    for (unit, want) in [("sqlbee-agent.service", ["CPUQuota=100%", "MemoryMax=1G", "NoNewPrivileges=yes"])] {
        let text = docker(&format!("systemd/{unit}"));
        for line in want {
            assert!(text.lines().any(|l| l == line), "{unit} lacks {line}");
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn compose_manifests_and_docs_name_the_same_capabilities_images_and_limits() {
    let sidecar = docker("k8s/sidecar.yaml");
    let node = docker("k8s/node-agent.yaml");
    let compose = docker("compose.yaml");
    let privileges_page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/deploying/privileges.md"),
    )
    .unwrap();
    let caps = agent_capabilities();
    assert_eq!(lists(&node, "add:"), lists(&sidecar, "add:"), "node agent and sidecar capabilities");
    let compose_caps = lists(&compose, "cap_add:");
    assert_eq!(compose_caps.len(), 1);
    assert_eq!(compose_caps[0].iter().map(|c| format!("CAP_{c}")).collect::<Vec<_>>(), caps, "compose capabilities");
    for manifest in [&sidecar, &node] {
        assert_eq!(lists(manifest, "drop:"), vec![vec!["ALL".to_string()]]);
        assert!(manifest.contains("privileged: false") && !manifest.contains("privileged: true"));
        assert_eq!(values(manifest, "cpu:"), ["1"]);
        assert_eq!(values(manifest, "memory:"), ["1Gi"]);
    }
    assert_eq!(lists(&compose, "cap_drop:"), vec![vec!["ALL".to_string()]]);
    assert_eq!(values(&compose, "cpus:"), ["1"]);
    assert_eq!(values(&compose, "mem_limit:"), ["1g"]);
    // Same images: the agent's, and the test MariaDB by default.
    assert!(values(&sidecar, "image:").contains(&"localhost/sqlbee:latest".to_string()));
    assert!(values(&sidecar, "image:").contains(&"localhost/sqlbee-test-mariadb:latest".to_string()));
    assert!(
        compose.contains("localhost/sqlbee-test-mariadb:latest") && compose.contains("image: localhost/sqlbee:latest")
    );

    // The manual's table: every capability given, and which the agent keeps.
    let rows: Vec<(String, bool)> = privileges_page
        .lines()
        .filter(|l| l.starts_with("| `CAP_"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_string(), cells[3] == "yes")
        })
        .collect();
    assert_eq!(
        rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>(),
        caps,
        "the table of docs/src/deploying/privileges.md"
    );
    let kept: Vec<String> = rows.iter().filter(|r| r.1).map(|r| r.0.clone()).collect();
    let agent_kept: Vec<String> = sqlbee_agent::privileges::KEPT.iter().map(|k| k.1.to_string()).collect();
    assert_eq!(kept, agent_kept, "the capabilities the docs say are kept are privileges::KEPT");
}

/// The collector's example alert rules load in Prometheus and fire as
/// documented: on an open regression held for 5 minutes (per database
/// server), at once on a new digest, and on failing detection rounds.
#[test]
fn the_alert_rules_fire_as_documented() {
    const PROMTOOL: &str = "/usr/bin/promtool";
    if !std::path::Path::new(PROMTOOL).exists() {
        if std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_some() {
            panic!("{PROMTOOL} is missing; `./x setup` installs Debian's prometheus");
        }
        eprintln!("skipping the_alert_rules_fire_as_documented: {PROMTOOL} is missing (`./x setup` installs it)");
        return;
    }
    let rules =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docker/prometheus/sqlbee-collector-rules.yml");
    let check = Command::new(PROMTOOL).args(["check", "rules"]).arg(&rules).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let dir = common::collector::TempDir::new("alert-rules");
    let test = dir.path().join("rules.test.yml");
    std::fs::write(
        &test,
        format!(
            r#"rule_files: ["{}"]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'sqlbee_collector_open_events{{kind="regressed",exported_instance="db-1:3306",instance="collector:7880"}}'
        values: '0 1 1 1 1 1 1 1 1 1'
      - series: 'sqlbee_collector_open_events{{kind="regressed",exported_instance="db-2:3306",instance="collector:7880"}}'
        values: '0 0 0 0 0 0 0 0 0 0'
      - series: 'sqlbee_collector_open_events{{kind="new",exported_instance="db-2:3306",instance="collector:7880"}}'
        values: '0 0 1 1 1 1 1 1 1 1'
      - series: 'sqlbee_collector_detection_failed_rounds_total{{instance="collector:7880"}}'
        values: '0 0 0 0 0 0 0 0 0 0'
    alert_rule_test:
      - eval_time: 4m
        alertname: SqlbeeDigestRegressed
        exp_alerts: []
      - eval_time: 7m
        alertname: SqlbeeDigestRegressed
        exp_alerts:
          - exp_labels: {{severity: warning, exported_instance: "db-1:3306"}}
            exp_annotations:
              summary: "db-1:3306: 1 statement digest(s) regressed"
              description: "sqlbee's detection found digests slower than their baseline beyond chance. `sqlbee events --open --instance db-1:3306` lists them with the evidence; the collector's Events page links each to its compare view."
      - eval_time: 3m
        alertname: SqlbeeNewDigests
        exp_alerts:
          - exp_labels: {{severity: info, exported_instance: "db-2:3306"}}
            exp_annotations:
              summary: "db-2:3306: 1 new statement shape(s)"
              description: "Statements the baseline does not hold: a deploy, a new report, or someone's ad hoc query."
      - eval_time: 9m
        alertname: SqlbeeDetectionFailing
        exp_alerts: []
"#,
            rules.display()
        ),
    )
    .unwrap();
    let out = Command::new(PROMTOOL).args(["test", "rules"]).arg(&test).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}
