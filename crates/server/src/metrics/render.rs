//! The metric table written out: Prometheus text for `/metrics`, fields for `/server_info`.

use super::table::{METRICS, Samples, Sources};
use serde_json::{Map, Value};
use std::fmt::Write;

/// The text exposition: `HELP`, `TYPE` and the samples of every row with a name.
pub fn prometheus(sources: &Sources<'_>) -> String {
    let mut out = String::new();
    for m in METRICS {
        let Some(name) = m.name else { continue };
        let _ = writeln!(
            out,
            "# HELP specula:{name} {}\n# TYPE specula:{name} {}",
            m.help,
            m.kind.as_str()
        );
        match (m.value)(sources) {
            Samples::One(v) => {
                let _ = writeln!(out, "specula:{name} {v}");
            }
            Samples::Labelled { label, values } => {
                for (value, v) in values {
                    let _ = writeln!(out, "specula:{name}{{{label}=\"{value}\"}} {v}");
                }
            }
            Samples::Histogram {
                buckets,
                sum,
                count,
            } => {
                for (le, c) in buckets {
                    let _ = writeln!(out, "specula:{name}_bucket{{le=\"{le}\"}} {c}");
                }
                let _ = writeln!(
                    out,
                    "specula:{name}_sum {sum}\nspecula:{name}_count {count}"
                );
            }
        }
    }
    out
}

/// Puts the value of every row with a `/server_info` place into `info`, at its path (objects on
/// the way are made when missing).
pub fn server_info(info: &mut Map<String, Value>, sources: &Sources<'_>) {
    for m in METRICS {
        let Some((field, sections)) = m.info.and_then(<[_]>::split_last) else {
            continue;
        };
        let mut at = &mut *info;
        for section in sections {
            let next = at
                .entry(*section)
                .or_insert_with(|| Value::Object(Map::new()));
            at = match next {
                Value::Object(map) => map,
                _ => unreachable!("`{section}` of /server_info is an object"),
            };
        }
        let value = match (m.value)(sources) {
            Samples::One(v) => v.json(),
            _ => unreachable!("a /server_info field is one number"),
        };
        at.insert((*field).to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_row_is_written_once_with_its_value() {
        let (engine, server) = crate::golden::sample();
        let sources = server.sources(&engine, 64);
        let text = prometheus(&sources);
        let mut info = Map::new();
        server_info(&mut info, &sources);
        let info = Value::Object(info);
        let (mut names, mut paths) = (HashSet::new(), HashSet::new());
        for m in METRICS {
            assert!(
                m.name.is_some() || m.info.is_some(),
                "{}: shown nowhere",
                m.help
            );
            let samples = (m.value)(&sources);
            if let Some(name) = m.name {
                assert!(names.insert(name), "{name} declared twice");
                let head = format!("# HELP specula:{name} {}\n# TYPE specula:{name} ", m.help);
                assert_eq!(text.matches(&head).count(), 1, "{name}");
                if let Samples::One(v) = samples {
                    assert!(text.contains(&format!("\nspecula:{name} {v}\n")), "{name}");
                }
            }
            if let Some(path) = m.info {
                assert!(paths.insert(path), "{path:?} declared twice");
                let Samples::One(v) = samples else {
                    panic!("{path:?}: a /server_info field is one number")
                };
                let at = path.iter().fold(&info, |at, key| &at[*key]);
                assert_eq!(*at, v.json(), "{path:?}");
            }
        }
    }
}
