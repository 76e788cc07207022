//! Settings: flags beat the TOML file, which beats the defaults; unknown keys
//! and impossible values are refused with a message.

use std::path::PathBuf;

use reservoir_server::config::*;

#[test]
fn flags_beat_file_beats_default() {
    let dir = crate::support::tempdir().unwrap();
    let path = dir.path().join("reservoir.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:9000\"\nwriter_shards = 2\ndata_dir = \"/tmp/x\"\n",
    )
    .unwrap();
    let args = ServeArgs {
        config: Some(path),
        data_dir: Some("/tmp/y".into()),
        ..Default::default()
    };
    let c = args.resolve().unwrap();
    assert_eq!(c.listen, "127.0.0.1:9000".parse().unwrap());
    assert_eq!(c.writer_shards, 2);
    assert_eq!(c.data_dir, PathBuf::from("/tmp/y"));
    assert_eq!(c.max_body_bytes, 64 * 1024);
}

#[test]
fn unknown_file_keys_and_bad_values_are_refused() {
    let dir = crate::support::tempdir().unwrap();
    let path = dir.path().join("reservoir.toml");
    std::fs::write(&path, "listne = \"127.0.0.1:9000\"\n").unwrap();
    assert!(ServeArgs {
        config: Some(path),
        ..Default::default()
    }
    .resolve()
    .is_err());
    assert!(ServeArgs {
        writer_shards: Some(0),
        ..Default::default()
    }
    .resolve()
    .is_err());
    assert!(ServeArgs {
        log: Some(LogKind::Kafka),
        ..Default::default()
    }
    .resolve()
    .is_err());
}

#[test]
fn project_settings_resolve_and_refuse() {
    let dir = crate::support::tempdir().unwrap();
    let path = dir.path().join("projector.toml");
    std::fs::write(
        &path,
        "log = \"kafka\"\nbrokers = \"b:9092\"\nlisten = \"127.0.0.1:9001\"\n",
    )
    .unwrap();
    let c = ProjectArgs {
        config: Some(path),
        topic: Some("t".into()),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    assert_eq!(c.listen, "127.0.0.1:9001".parse().unwrap());
    assert_eq!(
        c.log,
        ProjectSource::Kafka {
            brokers: "b:9092".into(),
            topic: "t".into()
        }
    );
    // A server's data directory stands for its `log` directory.
    let server = dir.path().join("server");
    std::fs::create_dir_all(server.join("log")).unwrap();
    std::fs::write(server.join("log/CURRENT"), "").unwrap();
    let c = ProjectArgs {
        log_dir: Some(server.clone()),
        data_dir: Some(dir.path().join("projector")),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    assert_eq!(
        c.log,
        ProjectSource::Embedded {
            log_dir: server.join("log")
        }
    );
    for bad in [
        ProjectArgs {
            log: Some(ProjectLogKind::Kafka),
            ..Default::default()
        },
        ProjectArgs {
            log_dir: Some(server.clone()),
            data_dir: Some(server.clone()),
            ..Default::default()
        },
        ProjectArgs {
            brokers: Some("b:9092".into()),
            ..Default::default()
        },
    ] {
        assert!(bad.resolve().is_err());
    }
}

/// Kafka security settings pass through to librdkafka: only
/// `security.protocol`, `sasl.*` and `ssl.*`, from flags or the file; a
/// setting librdkafka does not know stops the binary with librdkafka's words
/// (so the settings really reach the client).
#[test]
fn kafka_security_settings_pass_through_and_nothing_else() {
    let dir = crate::support::tempdir().unwrap();
    let path = dir.path().join("reservoir.toml");
    std::fs::write(&path, "kafka_properties = [\"sasl.password=secret\"]\n").unwrap();
    let from_file = ServeArgs {
        config: Some(path),
        ..Default::default()
    };
    assert_eq!(
        from_file.resolve().unwrap().kafka_properties,
        vec![("sasl.password".to_string(), "secret".to_string())]
    );
    let flags = ServeArgs {
        kafka_properties: Some(vec![
            "security.protocol=SASL_SSL".into(),
            "ssl.ca.location=/etc/ca.pem".into(),
        ]),
        ..Default::default()
    };
    assert_eq!(flags.resolve().unwrap().kafka_properties.len(), 2);
    for refused in [
        "bootstrap.servers=elsewhere:9092",
        "sasl.mechanism",
        "ssl.key.password=",
    ] {
        let args = ServeArgs {
            kafka_properties: Some(vec![refused.into()]),
            ..Default::default()
        };
        assert!(args.resolve().is_err(), "{refused}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reservoir"))
        .args(["serve", "--log", "kafka", "--brokers", "127.0.0.1:1"])
        .args(["--kafka-property", "ssl.no.such.setting=1", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ssl.no.such.setting"), "{stderr}");
}
