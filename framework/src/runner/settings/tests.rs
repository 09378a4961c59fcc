//! The settings' unit tests: precedence, defaults, problems, secrets.

use std::time::Duration;

use clap::Command;

use super::table::instance_id_from;
use super::*;
use crate::config::EngineConfig;

fn command() -> Command {
    Command::new("test").args(arguments())
}

fn declared() -> Declared {
    Declared {
        name: "billing".into(),
        input: Some("orders".into()),
        outputs: vec!["invoices".into()],
    }
}

fn resolve_args(args: &[&str]) -> Result<Settings, Vec<Error>> {
    let matches = command()
        .try_get_matches_from(std::iter::once("test").chain(args.iter().copied()))
        .expect("arguments parse");
    resolve(&matches, &BTreeMap::new(), &declared(), "host-1")
}

/// Settings from `config`, one `--kafka` flag and one variable.
fn resolve_with(
    config: &tempfile::NamedTempFile,
    kafka: &str,
    (name, value): (&str, &str),
) -> Settings {
    let matches = command()
        .try_get_matches_from([
            "test",
            "--config",
            config.path().to_str().expect("utf-8"),
            "--kafka",
            kafka,
        ])
        .expect("parse");
    let env = BTreeMap::from([(name.to_owned(), value.to_owned())]);
    resolve(&matches, &env, &declared(), "h").expect("valid")
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), text).expect("write");
    file
}

fn keys_of(problems: &[Error]) -> Vec<String> {
    problems
        .iter()
        .map(|e| match e {
            Error::Config { key, .. } => key.clone(),
            other => panic!("not a config error: {other}"),
        })
        .collect()
}

/// Issue 16, part 3: the same binary against `staging.orders` and `prod.invoices`.
#[test]
fn declared_topics_are_defaults_that_flags_variables_and_the_file_rename() {
    let settings = resolve_args(&[
        "--input",
        "staging.orders",
        "--output",
        "invoices=prod.invoices,audit",
    ])
    .expect("valid");
    let engine = &settings.engine;
    assert_eq!(engine.input_topic, "staging.orders");
    assert_eq!(
        engine.renamed_outputs,
        BTreeMap::from([("invoices".to_owned(), "prod.invoices".to_owned())])
    );
    assert_eq!(engine.output_topics, ["audit"], "a plain topic is added");

    let config = file("input = \"prod.orders\"\noutputs = \"invoices = prod.invoices\"\n");
    let from_file = resolve_with(&config, "linger.ms=5", ("ONCEFLOW_KAFKA_ACKS", "all"));
    assert_eq!(from_file.engine.input_topic, "prod.orders");
    assert_eq!(
        from_file.engine.renamed_outputs["invoices"],
        "prod.invoices"
    );

    // A rename names a declared output; an empty side is no rename.
    let problems = resolve_args(&["--outputs", "receipts=prod.receipts"]).expect_err("unknown");
    assert_eq!(keys_of(&problems), ["outputs"]);
    assert!(
        problems[0].to_string().contains("invoices"),
        "{}",
        problems[0]
    );
    let problems = resolve_args(&["--outputs", "invoices="]).expect_err("empty");
    assert_eq!(keys_of(&problems), ["outputs"]);
}

#[test]
fn the_role_and_the_effect_settings_parse_and_bad_roles_are_named() {
    let settings = resolve_args(&[]).expect("defaults");
    assert_eq!(settings.role, Role::All);
    assert_eq!(settings.effect_results, None);
    assert_eq!(settings.engine.effects_topic, None, "off unless asked for");
    let settings = resolve_args(&[
        "--role",
        "effects",
        "--effects-topic",
        "shop-intents",
        "--effect-results",
        "shipped",
    ])
    .expect("valid");
    assert_eq!(settings.role, Role::Effects);
    assert_eq!(settings.effect_results.as_deref(), Some("shipped"));
    assert_eq!(
        settings.engine.effects_topic.as_deref(),
        Some("shop-intents")
    );
    let problems = resolve_args(&["--role", "executor"]).expect_err("unknown role");
    assert_eq!(keys_of(&problems), ["role"]);
    assert!(
        problems[0]
            .to_string()
            .contains("processor, effects or all"),
        "{}",
        problems[0]
    );
}

#[test]
fn verify_config_shows_each_declared_topic_and_where_it_goes() {
    let settings = resolve_args(&[
        "--input",
        "staging.orders",
        "--outputs",
        "invoices=prod.invoices,audit",
    ])
    .expect("valid");
    let shown = crate::runner::commands::topic_mapping(&settings);
    assert_eq!(
        shown,
        "topics:\n  input  orders -> staging.orders  (renamed)\n  output invoices -> \
         prod.invoices  (renamed)\n  output audit  (not declared)\n"
    );
    let plain = crate::runner::commands::topic_mapping(&resolve_args(&[]).expect("valid"));
    assert_eq!(plain, "topics:\n  input  orders\n  output invoices\n");
}

#[test]
fn defaults_come_from_the_table_the_processor_and_the_host() {
    let settings = resolve_args(&[]).expect("valid");
    let engine = &settings.engine;
    assert_eq!(engine.bootstrap_servers, "localhost:9092");
    assert_eq!(engine.group, "billing");
    assert_eq!(engine.instance_id, "host-1");
    assert_eq!(engine.input_topic, "orders");
    assert_eq!(engine.commit_interval, Duration::from_millis(100));
    assert_eq!(engine.dedup_window, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(engine.dead_letter_topic(), "billing-dlq");
    assert_eq!(engine.changelog_topic(), "billing-txlog");
    assert_eq!(settings.metrics_address, "127.0.0.1:9464".parse().ok());
    let defaults = EngineConfig::new("b", "g", "i", "t", "s");
    assert_eq!(engine.max_batch_records, defaults.max_batch_records);
    assert_eq!(engine.max_attempts, defaults.max_attempts);
    assert_eq!(engine.max_retry_time, defaults.max_retry_time);
    assert_eq!(engine.transaction_timeout, defaults.transaction_timeout);
    assert_eq!(engine.event_id_header, defaults.event_id_header);
}

#[test]
fn the_command_line_wins_over_the_file_which_wins_over_defaults() {
    let config = file(
        "brokers = \"file:9092\"\ncommit_interval = \"250ms\"\nmax_batch_records = 50\n\
         [kafka]\n\"linger.ms\" = 7\n\"client.id\" = \"from-file\"\n",
    );
    let path = config.path().to_str().expect("utf-8 path");
    let settings = resolve_args(&[
        "--config",
        path,
        "--brokers",
        "cli:9092",
        "--kafka",
        "client.id=from-cli",
    ])
    .expect("valid");
    assert_eq!(settings.engine.bootstrap_servers, "cli:9092");
    assert_eq!(settings.engine.commit_interval, Duration::from_millis(250));
    assert_eq!(settings.engine.max_batch_records, 50);
    assert_eq!(
        settings.engine.kafka_properties,
        [
            ("client.id".to_owned(), "from-cli".to_owned()),
            ("linger.ms".to_owned(), "7".to_owned())
        ]
    );
    let source = |key: &str| {
        settings
            .resolved
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, _, s)| s.clone())
    };
    assert_eq!(source("brokers"), Some(Source::CommandLine));
    assert_eq!(
        source("commit_interval"),
        Some(Source::File(config.path().into()))
    );
    assert_eq!(source("delivery"), Some(Source::Default));
}

#[test]
fn kafka_variables_override_the_file_and_lose_to_the_command_line() {
    let config = file("[kafka]\n\"linger.ms\" = \"1\"\n\"acks\" = \"all\"\n");
    let settings = resolve_with(&config, "acks=-1", ("ONCEFLOW_KAFKA_LINGER_MS", "5"));
    assert_eq!(
        settings.engine.kafka_properties,
        [
            ("acks".to_owned(), "-1".to_owned()),
            ("linger.ms".to_owned(), "5".to_owned())
        ]
    );
}

#[test]
fn secrets_come_from_files_or_variables_and_are_never_shown() {
    let secret_file = file("s3cret-from-file\n");
    let config = file("[kafka]\n\"ssl.key.password\" = \"s3cret-in-toml\"\n");
    let settings = resolve_with(
        &config,
        &format!("sasl.password.file={}", secret_file.path().display()),
        (
            "ONCEFLOW_KAFKA_SSL_KEY_PEM",
            "-----BEGIN PRIVATE KEY-----s3cret-pem",
        ),
    );
    let value = |key: &str| {
        settings
            .engine
            .kafka_properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(value("sasl.password").as_deref(), Some("s3cret-from-file"));
    assert_eq!(value("sasl.password.file"), None);
    assert!(value("ssl.key.pem").is_some() && value("ssl.key.password").is_some());

    let shown = format!("{:?} {:?}", settings.resolved, settings);
    assert!(!shown.contains("s3cret"), "{shown}");
    let (_, password, source) = settings
        .resolved
        .iter()
        .find(|(key, _, _)| key == "kafka.sasl.password")
        .expect("listed");
    assert_eq!(password, "[redacted]");
    assert!(
        source
            .to_string()
            .contains(&secret_file.path().display().to_string()),
        "{source}"
    );
}

#[test]
fn a_secret_file_that_cannot_be_read_or_a_doubled_secret_is_a_problem() {
    let problems = resolve_args(&[
        "--kafka",
        "sasl.password.file=/nonexistent/password",
        "--kafka",
        "ssl.key.password=x",
        "--kafka",
        "ssl.key.password.file=/etc/hostname",
    ])
    .expect_err("invalid");
    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 2, "{text:?}");
    assert!(text[0].contains("/nonexistent/password"), "{text:?}");
    assert!(text[1].contains("not both"), "{text:?}");
}

#[test]
fn every_bad_value_is_one_problem_naming_its_key() {
    let problems = resolve_args(&[
        "--commit-interval",
        "fast",
        "--delivery",
        "twice",
        "--max-batch-records",
        "many",
        "--metrics-address",
        "everywhere",
        "--kafka",
        "no-equals-sign",
    ])
    .expect_err("invalid");
    assert_eq!(
        keys_of(&problems),
        [
            "kafka",
            "commit_interval",
            "max_batch_records",
            "delivery",
            "metrics_address"
        ]
    );
    let message = problems[1].to_string();
    assert!(
        message.contains("`fast`") && message.contains("250ms"),
        "{message}"
    );
}

#[test]
fn the_txlog_cache_is_a_size_in_bytes_with_a_unit() {
    let default = resolve_args(&[]).expect("valid");
    assert_eq!(default.engine.txlog_cache_size, 16 << 20);
    for (text, bytes) in [
        ("256MiB", 256 << 20),
        ("1GiB", 1 << 30),
        ("512KiB", 512 << 10),
        ("1048576", 1 << 20),
    ] {
        let settings = resolve_args(&["--txlog-cache-size", text]).expect(text);
        assert_eq!(settings.engine.txlog_cache_size, bytes, "{text}");
    }
    for bad in ["16MB", "lots", "1.5MiB", "MiB", "99999999999999999999GiB"] {
        let problems = resolve_args(&["--txlog-cache-size", bad]).expect_err(bad);
        assert_eq!(keys_of(&problems), ["txlog_cache_size"], "{bad}");
        assert!(problems[0].to_string().contains("16MiB"), "{bad}");
    }
}

#[test]
fn engine_level_problems_are_reported_too() {
    let problems =
        resolve_args(&["--max-retry-time", "200s", "--group", "has space"]).expect_err("invalid");
    assert_eq!(keys_of(&problems), ["group", "max_retry_time"]);
}

#[test]
fn unknown_file_keys_are_errors_that_list_the_known_ones() {
    let config = file("brokers = \"a:1\"\ncommit_intervall = \"1s\"\n");
    let matches = command()
        .try_get_matches_from(["test", "--config", config.path().to_str().expect("utf-8")])
        .expect("parse");
    let problems = resolve(&matches, &BTreeMap::new(), &declared(), "h").expect_err("unknown key");
    assert_eq!(keys_of(&problems), ["commit_intervall"]);
    assert!(
        problems[0].to_string().contains("commit_interval,"),
        "{}",
        problems[0]
    );
}

#[test]
fn a_processor_without_an_input_needs_one_configured() {
    let matches = command().try_get_matches_from(["test"]).expect("parse");
    let none = Declared {
        name: "p".into(),
        ..Declared::default()
    };
    let problems = resolve(&matches, &BTreeMap::new(), &none, "h").expect_err("no input");
    assert_eq!(keys_of(&problems), ["input"]);
}

#[test]
fn host_names_become_valid_instance_ids() {
    assert_eq!(instance_id_from("billing-0"), "billing-0");
    assert_eq!(instance_id_from("my host:1"), "my-host-1");
    assert_eq!(instance_id_from(""), "instance");
}

#[test]
fn every_setting_has_a_flag_and_a_variable() {
    let command = command();
    for key in keys() {
        let arg = command
            .get_arguments()
            .find(|a| a.get_id() == key)
            .expect("an argument per setting");
        assert_eq!(arg.get_long(), Some(flag(key).as_str()));
        assert_eq!(
            arg.get_env().and_then(|e| e.to_str()),
            Some(env_name(key).as_str())
        );
    }
}

#[test]
fn every_default_reads_back_as_the_value_the_runner_starts_from() {
    let start = Settings::start();
    for s in SETTINGS {
        if let Fallback::Value(render) = s.default {
            let mut settings = Settings::start();
            let text = render(&start);
            (s.set)(&text, &mut settings).unwrap_or_else(|e| panic!("{}: `{text}`: {e}", s.key));
            assert_eq!(
                format!("{settings:?}"),
                format!("{start:?}"),
                "{} = `{text}` does not read back as its default",
                s.key
            );
        }
    }
    // The engine's defaults are EngineConfig::new's, rendered as a flag gives them.
    let help = command().render_long_help().to_string();
    for shown in [
        "[default: 100ms]",
        "[default: 7days]",
        "[default: exactly-once]",
    ] {
        assert!(help.contains(shown), "{shown} missing:\n{help}");
    }
}

#[test]
fn help_shows_derived_defaults_from_where_they_are_derived() {
    let help = command().render_long_help().to_string();
    for shown in [
        "Dead-letter topic [default: <group>-dlq]",
        "Changelog topic [default: <group>-txlog]",
        "[default: <group>-effects when the binary has an effect executor, else effects are off]",
        "Consumer group, one per operator [default: the processor's name]",
    ] {
        assert!(help.contains(shown), "{shown} missing:\n{help}");
    }
}

#[test]
fn a_replication_factor_too_large_for_kafka_is_a_problem_not_the_brokers_default() {
    let problems =
        resolve_args(&["--changelog-replication-factor", "99999999999"]).expect_err("too large");
    assert_eq!(keys_of(&problems), ["changelog_replication_factor"]);
    let settings = resolve_args(&["--changelog-replication-factor", "3"]).expect("valid");
    assert_eq!(settings.engine.changelog_replication_factor, Some(3));
    let settings = resolve_args(&[]).expect("valid");
    assert_eq!(settings.engine.changelog_replication_factor, None);
}

/// The application's own settings: the file's `[app]` table, then `ONCEFLOW_APP_*`, then
/// `--app`, each over the one before; flag and variable texts read as TOML values when
/// they are one; secrets shown redacted; onceflow's settings unaffected.
#[test]
fn application_settings_come_from_the_file_the_variables_and_the_flags_in_that_order() {
    let config = file(
        "commit_interval = \"250ms\"\n\
         [app]\n\
         limit = 10\n\
         currency = \"EUR\"\n\
         api_password = \"from-file\"\n\
         regions = [\"eu\", \"us\"]\n",
    );
    let matches = command()
        .try_get_matches_from([
            "test",
            "--config",
            config.path().to_str().expect("utf-8"),
            "--app",
            "limit=30",
            "--app",
            "note=plain text",
        ])
        .expect("parse");
    let env = BTreeMap::from([
        ("ONCEFLOW_APP_LIMIT".to_owned(), "20".to_owned()),
        ("ONCEFLOW_APP_CURRENCY".to_owned(), "CHF".to_owned()),
        ("ONCEFLOW_APP_STRICT".to_owned(), "true".to_owned()),
    ]);
    let (app, shown) = app(&matches, &env).expect("valid");
    assert_eq!(
        app["limit"].as_integer(),
        Some(30),
        "the flag over the variable"
    );
    assert_eq!(
        app["currency"].as_str(),
        Some("CHF"),
        "the variable over the file"
    );
    assert_eq!(
        app["strict"].as_bool(),
        Some(true),
        "a variable's text read as TOML"
    );
    assert_eq!(
        app["note"].as_str(),
        Some("plain text"),
        "else taken as a string"
    );
    assert_eq!(app["regions"].as_array().map(Vec::len), Some(2));
    let source = |key: &str| {
        shown
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, value, source)| (value.clone(), source.to_string()))
            .unwrap_or_else(|| panic!("{key} not shown: {shown:?}"))
    };
    assert_eq!(source("app.limit"), ("30".into(), "command line".into()));
    assert_eq!(
        source("app.currency"),
        ("\"CHF\"".into(), "$ONCEFLOW_APP_CURRENCY".into())
    );
    assert_eq!(source("app.api_password").0, redact::REDACTED);
    // onceflow's own settings read the same file as before.
    let settings = resolve(&matches, &env, &declared(), "h").expect("valid");
    assert_eq!(settings.engine.commit_interval, Duration::from_millis(250));
}

#[test]
fn an_app_flag_without_a_value_or_an_app_key_that_is_not_a_table_is_a_problem() {
    let matches = command()
        .try_get_matches_from(["test", "--app", "limit"])
        .expect("parse");
    let problems = app(&matches, &BTreeMap::new()).expect_err("no value");
    assert_eq!(keys_of(&problems), ["app"]);
    let config = file("app = 3\n");
    let matches = command()
        .try_get_matches_from(["test", "--config", config.path().to_str().expect("utf-8")])
        .expect("parse");
    let problems = app(&matches, &BTreeMap::new()).expect_err("not a table");
    assert_eq!(keys_of(&problems), ["app"]);
}
