//! The runner's command line, environment and file, through a real example binary
//! (`verify-config` connects to nothing).

mod common;

use std::process::Command;

fn verify(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = Command::new(common::example("billing"));
    command.args(args).arg("verify-config");
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("ONCEFLOW_")) {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    let output = command.output().expect("billing runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("no `{key}` in:\n{out}"))
}

#[test]
fn flags_beat_variables_which_beat_the_file_which_beats_defaults() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("billing.toml");
    std::fs::write(
        &file,
        "brokers = \"file:9092\"\ngroup = \"file-group\"\ncommit_interval = \"3s\"\n\
         max_batch_records = 7\n[kafka]\n\"client.id\" = \"file\"\n\"linger.ms\" = 9\n",
    )
    .expect("write");
    let (code, out, err) = verify(
        &[
            "--config",
            file.to_str().expect("utf-8"),
            "--brokers",
            "flag:9092",
            "--kafka",
            "client.id=flag",
        ],
        &[
            ("ONCEFLOW_BROKERS", "env:9092"),
            ("ONCEFLOW_GROUP", "env-group"),
            ("ONCEFLOW_KAFKA_LINGER_MS", "4"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        line(&out, "brokers").contains("\"flag:9092\"  # command line"),
        "{out}"
    );
    assert!(
        line(&out, "group").contains("\"env-group\"  # $ONCEFLOW_GROUP"),
        "{out}"
    );
    assert!(line(&out, "commit_interval").contains("\"3s\""), "{out}");
    assert!(
        line(&out, "commit_interval").contains("billing.toml"),
        "{out}"
    );
    assert!(line(&out, "max_batch_records").contains("\"7\""), "{out}");
    assert!(
        line(&out, "delivery").contains("\"exactly-once\"  # default"),
        "{out}"
    );
    assert!(
        line(&out, "input").contains("\"orders\"  # the processor's declaration"),
        "{out}"
    );
    assert!(line(&out, "kafka.client.id").contains("\"flag\""), "{out}");
    assert!(
        line(&out, "kafka.linger.ms").contains("\"4\"  # $ONCEFLOW_KAFKA_LINGER_MS"),
        "{out}"
    );
    assert!(
        out.contains("configuration OK: transactional ID `env-group-"),
        "{out}"
    );
}

#[test]
fn bad_configuration_fails_before_connecting_with_one_line_per_problem() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "delivery = \"twice\"\n").expect("write");
    let (code, out, err) = verify(
        &[
            "--config",
            file.to_str().expect("utf-8"),
            "--commit-interval",
            "soon",
        ],
        &[("ONCEFLOW_ON_ERROR", "ignore")],
    );
    assert_eq!(code, 2, "{out}{err}");
    let problems: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(problems.len(), 3, "{err}");
    assert!(
        err.contains("`commit_interval` = `soon`: a duration such as 250ms"),
        "{err}"
    );
    assert!(
        err.contains("`delivery` = `twice`: exactly-once, at-least-once or at-most-once"),
        "{err}"
    );
    assert!(
        err.contains("`on_error` = `ignore`: dead-letter, skip or stop"),
        "{err}"
    );
    assert!(
        err.contains("3 configuration problem(s); nothing was started"),
        "{err}"
    );
}

#[test]
fn unknown_keys_in_the_file_are_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("typo.toml");
    std::fs::write(&file, "comit_interval = \"1s\"\n").expect("write");
    let (code, _, err) = verify(&["--config", file.to_str().expect("utf-8")], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`comit_interval`"), "{err}");
    assert!(err.contains("one of the known keys: brokers,"), "{err}");
}

#[test]
fn help_lists_every_option_with_its_default() {
    let output = Command::new(common::example("billing"))
        .arg("--help")
        .output()
        .expect("runs");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--brokers",
        "--group",
        "--instance-id",
        "--state-dir",
        "--commit-interval",
        "--max-batch-records",
        "--delivery",
        "--dedup-window",
        "--metrics-address",
        "--log-format",
        "--kafka",
        "--config",
    ] {
        assert!(help.contains(flag), "{flag} missing:\n{help}");
    }
    assert!(help.contains("[default: 127.0.0.1:9464]"), "{help}");
    for command in ["verify-config", "inspect", "dlq"] {
        assert!(help.contains(command), "{command} missing:\n{help}");
    }
}

/// Runs `billing` (the default `run` subcommand) against a broker that is never reached:
/// the state directory is checked before anything connects.
fn run_with_state_dir(state_dir: &std::path::Path) -> (i32, String) {
    let output = Command::new(common::example("billing"))
        .args(["--brokers", "127.0.0.1:9", "--metrics-address", "off"])
        .args(["--instance-id", "perm-test", "--state-dir"])
        .arg(state_dir)
        .env_remove("RUST_LOG")
        .output()
        .expect("billing runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_state_dir_others_may_write_to_or_another_user_owns_stops_the_instance() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("dir");
    let open = root.path().join("shared");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let (code, err) = run_with_state_dir(&open);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&open.display().to_string()) && err.contains("mode 0777"),
        "{err}"
    );
    assert!(err.contains("writable by everyone"), "{err}");

    // Giving a directory away takes root, which CI is.
    let is_root = Command::new("id").arg("-u").output().expect("id").stdout == b"0\n";
    if is_root {
        let theirs = root.path().join("theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        let chown = Command::new("chown")
            .arg("4242")
            .arg(&theirs)
            .status()
            .expect("chown");
        assert!(chown.success());
        let (code, err) = run_with_state_dir(&theirs);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("owned by uid 4242"), "{err}");
    } else {
        eprintln!("not root: the owner check is covered by the unit test on `/`");
    }
}

/// `--version` names the binary, its own crate's version (from `#[derive(Processor)]`)
/// and onceflow's, and exits 0 without reading any setting.
#[test]
fn version_names_the_program_and_onceflow() {
    let output = Command::new(common::example("billing"))
        .arg("--version")
        .env("ONCEFLOW_COMMIT_INTERVAL", "not a duration")
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!(
            "billing {} (onceflow {})",
            env!("CARGO_PKG_VERSION"),
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// A binary made with `onceflow::run` takes no application settings: one given is a
/// configuration problem (exit 2) that says how to read them, not something ignored.
#[test]
fn an_application_setting_given_to_a_binary_that_takes_none_is_refused() {
    let (code, _, err) = verify(&["--app", "limit=3"], &[("ONCEFLOW_APP_REGION", "eu")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("takes no application settings"), "{err}");
    assert!(err.contains("run_with_settings"), "{err}");
}
