//! Publishing to the stream a `nats` source reads: every document one message on one
//! subject, one the source's filter takes and the source's stream holds ([`choose`]
//! decides which), each acknowledged by the stream; the admin client keeps a window
//! of publishes in flight, their acks awaited in order.

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use sluice_nats::NatsConfig;
use sluice_nats::admin::Admin;

pub struct Subject {
    admin: Admin,
    subject: String,
}

impl Subject {
    /// Connects to the source's server and settles the subject (`given`: `--subject`);
    /// creates the source's stream, holding that subject, when it does not exist.
    pub async fn open(config: &NatsConfig, given: Option<&str>) -> anyhow::Result<Subject> {
        let (url, stream) = (&config.url, &config.stream);
        let failed = |doing: &str| format!("{doing} on {url}");
        let admin = Admin::connect_to(&config.server())
            .await
            .map_err(|e| anyhow!(e))
            .with_context(|| failed("connecting"))?;
        let subjects = (admin.stream_subjects(stream).await)
            .map_err(|e| anyhow!(e))
            .with_context(|| failed(&format!("reading stream {stream}")))?;
        let subject = choose(
            stream,
            config.subject.as_deref(),
            given,
            subjects.as_deref(),
        )
        .map_err(|why| anyhow!(why))?;
        let holder = (admin.stream_of_subject(&subject).await)
            .map_err(|e| anyhow!(e))
            .with_context(|| failed(&format!("looking up the stream of subject {subject}")))?;
        match (holder, subjects) {
            (Some(holder), _) if holder == *stream => {}
            (Some(holder), _) => bail!(
                "subject {subject} belongs to stream {holder}, not to stream {stream}, which \
                 the source reads"
            ),
            (None, Some(subjects)) => bail!(
                "stream {stream} does not hold subject {subject} (its subjects: {})",
                subjects.join(", ")
            ),
            (None, None) => {
                (admin.create_stream(stream, &[&subject]).await)
                    .map_err(|e| anyhow!(e))
                    .with_context(|| failed(&format!("creating stream {stream}")))?;
                println!("created stream {stream} with subject {subject}");
            }
        }
        Ok(Subject { admin, subject })
    }

    /// `subject pageviews`.
    pub fn name(&self) -> String {
        format!("subject {}", self.subject)
    }

    /// Publishes `documents`; returns once the stream acknowledged every one.
    pub async fn send(&self, documents: Vec<Vec<u8>>) -> anyhow::Result<()> {
        let payloads = documents.into_iter().map(Bytes::from);
        (self.admin.publish_batch(&self.subject, payloads).await)
            .map_err(|e| anyhow!(e))
            .with_context(|| format!("publishing to subject {}", self.subject))?;
        Ok(())
    }
}

/// The subject to publish to, for a source reading `stream` through `filter`: `given`
/// (which the filter must take), else the filter when it is one subject, else the
/// stream's one subject (`subjects`: `None` when the stream does not exist yet).
fn choose(
    stream: &str,
    filter: Option<&str>,
    given: Option<&str>,
    subjects: Option<&[String]>,
) -> Result<String, String> {
    let name = "name one with --subject";
    match (given, filter) {
        (Some(given), _) if !is_subject(given) => Err(format!(
            "--subject {given:?} is not a subject to publish to: dot-separated tokens, none \
             empty, no spaces, no wildcards (e.g. events.eu)"
        )),
        (Some(given), Some(filter)) if !matches(filter, given) => Err(format!(
            "the source reads only subjects matching {filter}, and {given} does not"
        )),
        (Some(given), _) => Ok(given.to_string()),
        (None, Some(filter)) if is_subject(filter) => Ok(filter.to_string()),
        (None, Some(filter)) => Err(format!(
            "the source reads the subjects matching {filter}: {name} (e.g. one it matches)"
        )),
        (None, None) => match subjects {
            Some([one]) if is_subject(one) => Ok(one.clone()),
            Some(subjects) => Err(format!(
                "stream {stream} holds the subjects {}: {name}",
                subjects.join(", ")
            )),
            None => Err(format!(
                "stream {stream} does not exist and the source names no subject: {name} \
                 (the stream is created with it)"
            )),
        },
    }
}

/// Whether `subject` is one to publish to: dot-separated tokens, none empty or a
/// wildcard, no whitespace.
fn is_subject(subject: &str) -> bool {
    !subject.contains(char::is_whitespace)
        && subject
            .split('.')
            .all(|token| !token.is_empty() && token != "*" && token != ">")
}

/// Whether the filter `filter` takes `subject`: `*` stands for one token, a last `>`
/// for one or more.
fn matches(filter: &str, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for want in filter.split('.') {
        match (want, tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (want, Some(token)) if want == token => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_take_subjects_token_by_token() {
        for (filter, subject, taken) in [
            ("events", "events", true),
            ("events", "events.eu", false),
            ("events.*", "events.eu", true),
            ("events.*", "events.eu.x", false),
            ("events.>", "events.eu.x", true),
            ("events.>", "events", false),
            ("*.eu", "orders.eu", true),
            ("*.eu", "orders.us", false),
            (">", "a.b", true),
        ] {
            assert_eq!(matches(filter, subject), taken, "{filter} {subject}");
        }
    }

    #[test]
    fn the_subject_is_the_given_one_the_filter_or_the_streams_only_one() {
        let one = ["pageviews".to_string()];
        let two = ["a".to_string(), "b.>".to_string()];
        let ok = |s: &str| Ok(s.to_string());
        assert_eq!(choose("S", Some("pageviews"), None, None), ok("pageviews"));
        assert_eq!(choose("S", None, None, Some(&one)), ok("pageviews"));
        assert_eq!(
            choose("S", Some("events.>"), Some("events.eu"), None),
            ok("events.eu")
        );
        assert_eq!(choose("S", None, Some("x.y"), Some(&two)), ok("x.y"));
        for (filter, given, subjects, error) in [
            (
                Some("events.>"),
                None,
                None,
                "matching events.>: name one with --subject",
            ),
            (
                None,
                None,
                Some(&two[..]),
                "stream S holds the subjects a, b.>: name one",
            ),
            (
                None,
                None,
                None,
                "stream S does not exist and the source names no subject",
            ),
            (
                Some("events.>"),
                Some("orders.eu"),
                None,
                "and orders.eu does not",
            ),
            (
                None,
                Some("events.*"),
                None,
                "is not a subject to publish to",
            ),
            (None, Some("a..b"), None, "is not a subject to publish to"),
        ] {
            let got = choose("S", filter, given, subjects).unwrap_err();
            assert!(got.contains(error), "{got}");
        }
    }
}
