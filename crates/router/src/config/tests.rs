//! Tests of configuration: the documented file holds the defaults, flags win over the file,
//! and every invalid value is an error naming its option.

use std::path::Path;

use super::*;

fn example() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../conf/prefix-router.toml"
    ))
}

/// The command line's flags, as the binary parses them.
#[derive(clap::Parser)]
struct Flags {
    #[command(flatten)]
    settings: Settings,
}

fn error_of(settings: Settings) -> String {
    Config::from_settings(settings)
        .expect_err("must be refused")
        .to_string()
}

#[test]
fn example_file_documents_the_defaults() {
    let from_file = Config::load(Some(example()), Settings::default()).unwrap();
    let defaults = Config::from_settings(Settings::default()).unwrap();
    assert_eq!(format!("{from_file:?}"), format!("{defaults:?}"));
    assert_eq!(defaults.boot.policy.name, "kv_aware");
    assert_eq!(defaults.live.limits.max_body_bytes, 32 << 20);
    assert_eq!(defaults.boot.session_ttl, Duration::from_secs(1800));
    assert_eq!(defaults.boot.listen, "0.0.0.0:8080");
}

#[test]
fn flags_override_the_file() {
    let flags = Settings {
        policy: Some("round_robin".into()),
        worker_urls: Some(vec![
            "http://10.0.0.1:8000".into(),
            "http://backend/".into(),
        ]),
        ..Settings::default()
    };
    let config = Config::load(Some(example()), flags).unwrap();
    assert_eq!(config.boot.policy.name, "round_robin");
    assert_eq!(config.workers[1].url, "http://backend");
    assert_eq!(
        (config.workers[1].host.as_str(), config.workers[1].port),
        ("backend", 80)
    );
}

#[test]
fn invalid_values_name_their_option() {
    let cases: Vec<(Settings, &str)> = vec![
        (
            Settings {
                policy: Some("fastest".into()),
                ..Default::default()
            },
            "`policy`",
        ),
        (
            Settings {
                otlp_endpoint: Some("https://collector:4318".into()),
                ..Default::default()
            },
            "`otlp_endpoint`",
        ),
        (
            Settings {
                trace_sample_ratio: Some(1.5),
                ..Default::default()
            },
            "`trace_sample_ratio`",
        ),
        (
            Settings {
                trace_resource_attributes: Some(vec!["region".into()]),
                ..Default::default()
            },
            "`trace_resource_attributes`",
        ),
        (
            Settings {
                trace_queue_size: Some(0),
                ..Default::default()
            },
            "`trace_queue_size`",
        ),
        (
            Settings {
                cache_threshold: Some(-0.1),
                ..Default::default()
            },
            "`cache_threshold`",
        ),
        (
            Settings {
                balance_rel_threshold: Some(0.5),
                ..Default::default()
            },
            "`balance_rel_threshold`",
        ),
        (
            Settings {
                worker_urls: Some(vec!["10.0.0.1:80".into()]),
                ..Default::default()
            },
            "`worker_urls`",
        ),
        (
            Settings {
                worker_urls: Some(vec!["ftp://x".into()]),
                ..Default::default()
            },
            "`worker_urls`",
        ),
        (
            Settings {
                worker_urls: Some(vec!["http://x/v1".into()]),
                ..Default::default()
            },
            "`worker_urls`",
        ),
        (
            Settings {
                models: Some(vec![super::ModelPool {
                    name: "small".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            "`models`",
        ),
        (
            Settings {
                models: Some(vec![super::ModelPool {
                    name: "small".into(),
                    worker_urls: vec!["ftp://x".into()],
                    ..Default::default()
                }]),
                ..Default::default()
            },
            "`models`",
        ),
        (
            Settings {
                eviction_interval: Some(0.0),
                ..Default::default()
            },
            "`eviction_interval`",
        ),
        (
            Settings {
                max_tree_size: Some(0),
                ..Default::default()
            },
            "`max_tree_size`",
        ),
        (
            Settings {
                health_check_path: Some("health".into()),
                ..Default::default()
            },
            "`health_check_path`",
        ),
        // Was accepted, then replaced by `/` with a warning when health checks started.
        (
            Settings {
                health_check_path: Some("/he alth".into()),
                ..Default::default()
            },
            "`health_check_path`",
        ),
        (
            Settings {
                session_headers: Some(vec!["bad header".into()]),
                ..Default::default()
            },
            "`session_headers`",
        ),
        (
            Settings {
                session_fields: Some(vec!["metadata.user".into()]),
                ..Default::default()
            },
            "`session_fields`",
        ),
    ];
    for (settings, option) in cases {
        let message = error_of(settings);
        assert!(message.contains(option), "{message} does not name {option}");
    }
    let twice = vec!["http://a:1".into(), "http://a:1/".into()];
    assert!(
        error_of(Settings {
            worker_urls: Some(twice),
            ..Default::default()
        })
        .contains("twice")
    );
}

#[test]
fn unknown_file_keys_are_errors() {
    let dir = std::env::temp_dir().join(format!("prefix-router-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "polcy = \"cache_aware\"\n").unwrap();
    let error = Config::load(Some(&path), Settings::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("polcy"), "{error}");
    std::fs::write(&path, "balance_abs_threshold = -1\n").unwrap();
    assert!(Config::load(Some(&path), Settings::default()).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_names_every_policy_and_the_default_the_config_uses() {
    use clap::{CommandFactory, Parser};
    #[derive(Parser)]
    struct HelpFlags {
        #[command(flatten)]
        settings: Settings,
    }
    let help = HelpFlags::command().render_long_help().to_string();
    for name in policy::names() {
        assert!(help.contains(name), "--help does not name {name}");
    }
    let default = Config::from_settings(Settings::default())
        .unwrap()
        .boot
        .policy
        .name;
    assert!(help.contains(&format!("[default: {default}]")), "{help}");
}

#[test]
fn tokenizers_come_by_model_from_the_file_and_for_every_model_from_the_flag() {
    let dir = std::env::temp_dir().join(format!("prefix-router-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("router.toml");
    let file = "token_cache_bytes = 1024\n[tokenizers]\n\"Qwen/Qwen3-8B\" = \"/models/qwen3\"\n";
    std::fs::write(&path, file).unwrap();
    let flags = Settings {
        tokenizer: Some("/models/any".into()),
        ..Settings::default()
    };
    let config = Config::load(Some(&path), flags).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let tokens = &config.boot.tokens;
    assert_eq!(tokens.default.as_deref(), Some(Path::new("/models/any")));
    assert_eq!(tokens.models["Qwen/Qwen3-8B"], Path::new("/models/qwen3"));
    assert_eq!(tokens.cache_bytes, 1024);
    let defaults = Config::from_settings(Settings::default()).unwrap();
    assert_eq!(
        defaults.boot.tokens,
        crate::tokens::TokenSettings::default()
    );
    assert_eq!(config.restart_only_changes(&defaults), vec!["tokenizer*"]);
}

#[test]
fn every_default_the_flags_help_states_is_the_default() {
    use clap::{CommandFactory, Parser};
    let defaults = format!("{:?}", Config::from_settings(Settings::default()).unwrap());
    let mut checked = 0;
    for arg in Flags::command().get_arguments() {
        let (Some(long), Some(help)) = (arg.get_long(), arg.get_help()) else {
            continue;
        };
        let help = help.to_string();
        let Some(stated) = help
            .rsplit_once("[default: ")
            .and_then(|(_, rest)| rest.strip_suffix(']'))
        else {
            continue;
        };
        // Absent values and defaults read from the environment are not values to set.
        if stated.contains(' ') || stated.contains(',') || ["none", "empty"].contains(&stated) {
            continue;
        }
        let flags = Flags::try_parse_from(["prefix-router", &format!("--{long}"), stated])
            .unwrap_or_else(|e| panic!("--{long} {stated}: {e}"));
        let config = Config::from_settings(flags.settings).unwrap();
        assert_eq!(
            format!("{config:?}"),
            defaults,
            "--{long}'s help says {stated}"
        );
        checked += 1;
    }
    assert!(checked >= 35, "only {checked} stated defaults checked");
}

#[test]
fn a_worker_in_two_pools_serves_both_models() {
    let file = r#"
worker_urls = ["http://10.0.0.1:8000"]

[[models]]
name = "big"
worker_urls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]

[[models]]
name = "small"
aliases = ["s"]
worker_urls = ["http://10.0.0.2:8000"]
"#;
    let settings: Settings = toml::from_str(file).unwrap();
    let config = Config::from_settings(settings).unwrap();
    let names = |i: usize| -> Vec<String> {
        let served = config.workers[i].models.as_ref().unwrap();
        served.models.iter().map(|m| m.id.clone()).collect()
    };
    assert_eq!(config.workers.len(), 2);
    assert_eq!(names(0), ["big"]);
    assert_eq!(names(1), ["big", "s", "small"]);
}

#[test]
fn prefill_and_decode_workers_have_their_roles_and_one_listed_for_both_serves_both() {
    use clap::Parser;
    let flags = Flags::try_parse_from([
        "prefix-router",
        "--prefill",
        "http://10.0.0.1:8000",
        "--prefill",
        "http://10.0.0.3:8000",
        "--decode",
        "http://10.0.0.2:8000,http://10.0.0.3:8000",
        "--worker-urls",
        "http://10.0.0.4:8000",
    ])
    .unwrap();
    let config = Config::from_settings(flags.settings).unwrap();
    let roles: Vec<(&str, Role)> = (config.workers.iter())
        .map(|w| (w.url.as_str(), w.role))
        .collect();
    assert_eq!(
        roles,
        [
            ("http://10.0.0.4:8000", Role::Both),
            ("http://10.0.0.1:8000", Role::Prefill),
            ("http://10.0.0.3:8000", Role::Both),
            ("http://10.0.0.2:8000", Role::Decode),
        ]
    );
    let file = "prefill = [\"http://10.0.0.1:8000\"]\ndecode = [\"http://10.0.0.2:8000\"]\n";
    let settings: Settings = toml::from_str(file).unwrap();
    let config = Config::from_settings(settings).unwrap();
    assert_eq!(config.workers[1].role, Role::Decode);
    let bad = Settings {
        prefill: Some(vec!["ftp://10.0.0.1".into()]),
        ..Settings::default()
    };
    let error = Config::from_settings(bad).unwrap_err().to_string();
    assert!(error.contains("prefill"), "{error}");
}
