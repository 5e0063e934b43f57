//! What a driver under test claims to do, and which scenarios therefore apply to it.
//!
//! Capabilities are declared, not guessed: the caller of the suite says what the driver
//! does ([`Capabilities`]), every scenario says what it needs (a list of [`Capability`]),
//! and [`skip_reason`], a pure decision, skips a scenario whose needs the driver does not
//! claim, with the reason. A claimed capability is then held to the strictest check: a
//! driver that claims deletions and refuses a null document fails, it is not skipped.

use sluice_driver_sdk::{CommitPattern, Declared};
use std::fmt;
use std::str::FromStr;

/// One thing a driver may or may not do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Commits the data with the runtime checkpoint and a fence check in one store
    /// transaction: Open recovers exactly the last committed checkpoint (of the
    /// narrowest stored range covering its own), and after an Open every earlier
    /// instance of an overlapping range fails its commit as fenced.
    Authoritative,
    /// Takes a null document stored with `exists` as the deletion of its key.
    Deletes,
    /// Takes delta-updates bindings (stores appended, never loaded).
    DeltaUpdates,
    /// Refuses, failing the whole transaction, a document stored with `exists = false`
    /// whose key the store holds (as a table's primary key does).
    StrictExists,
    /// Describes an Apply without doing it (`dry_run`): a property of the protocol as
    /// much as of the driver, since Flow's current protocol has no dry run.
    DryRun,
}

impl Capability {
    pub const ALL: [Capability; 5] = [
        Capability::Authoritative,
        Capability::Deletes,
        Capability::DeltaUpdates,
        Capability::StrictExists,
        Capability::DryRun,
    ];

    /// The name of the capability on the command line and in skip reasons.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Authoritative => "authoritative",
            Capability::Deletes => "deletes",
            Capability::DeltaUpdates => "delta-updates",
            Capability::StrictExists => "strict-exists",
            Capability::DryRun => "dry-run",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Capability {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        (Capability::ALL.into_iter())
            .find(|c| c.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Capability::ALL.iter().map(|c| c.name()).collect();
                format!("no capability {name:?}; capabilities: {}", names.join(", "))
            })
    }
}

/// What the driver under test claims, and what its transport keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub authoritative: bool,
    pub deletes: bool,
    pub delta_updates: bool,
    pub strict_exists: bool,
    pub dry_run: bool,
}

impl Capabilities {
    /// Every capability: what an authoritative table-writing driver claims.
    pub const ALL: Capabilities = Capabilities {
        authoritative: true,
        deletes: true,
        delta_updates: true,
        strict_exists: true,
        dry_run: true,
    };

    /// What a driver declares ([`Driver::declared`]): authoritative when it commits by
    /// the remote-authoritative pattern; dry runs, which every driver of the seed's
    /// protocol takes (served over the current protocol, it has none: see `without`).
    ///
    /// [`Driver::declared`]: sluice_driver_sdk::Driver::declared
    pub fn declared(declared: Declared) -> Capabilities {
        Capabilities {
            authoritative: declared.pattern == CommitPattern::RemoteAuthoritative,
            deletes: declared.deletes,
            delta_updates: declared.delta_updates,
            strict_exists: declared.strict_exists,
            dry_run: true,
        }
    }

    pub fn has(&self, capability: Capability) -> bool {
        match capability {
            Capability::Authoritative => self.authoritative,
            Capability::Deletes => self.deletes,
            Capability::DeltaUpdates => self.delta_updates,
            Capability::StrictExists => self.strict_exists,
            Capability::DryRun => self.dry_run,
        }
    }

    /// These capabilities without `capability`.
    pub fn without(mut self, capability: Capability) -> Capabilities {
        let flag = match capability {
            Capability::Authoritative => &mut self.authoritative,
            Capability::Deletes => &mut self.deletes,
            Capability::DeltaUpdates => &mut self.delta_updates,
            Capability::StrictExists => &mut self.strict_exists,
            Capability::DryRun => &mut self.dry_run,
        };
        *flag = false;
        self
    }
}

/// Why a scenario needing `needs` does not apply to a driver claiming `claimed`: the
/// capabilities it lacks, or `None` if it applies.
pub fn skip_reason(needs: &[Capability], claimed: &Capabilities) -> Option<String> {
    let missing: Vec<&str> = (needs.iter())
        .filter(|need| !claimed.has(**need))
        .map(|need| need.name())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "the driver does not claim the capability {}",
            missing.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Capability::*;

    #[test]
    fn a_scenario_applies_only_when_every_capability_it_needs_is_claimed() {
        let none = Capabilities::ALL
            .without(Authoritative)
            .without(Deletes)
            .without(DeltaUpdates)
            .without(StrictExists)
            .without(DryRun);
        let cases: [(&[Capability], Capabilities, Option<&str>); 7] = [
            (&[], Capabilities::ALL, None),
            (&[], none, None),
            (&[Authoritative, Deletes], Capabilities::ALL, None),
            (
                &[Deletes],
                Capabilities::ALL.without(Deletes),
                Some("the driver does not claim the capability deletes"),
            ),
            (&[Deletes], Capabilities::ALL.without(DeltaUpdates), None),
            (
                &[Authoritative, StrictExists],
                none,
                Some("the driver does not claim the capability authoritative, strict-exists"),
            ),
            (
                &[DeltaUpdates, StrictExists],
                Capabilities::ALL.without(StrictExists),
                Some("the driver does not claim the capability strict-exists"),
            ),
        ];
        for (needs, claimed, want) in cases {
            assert_eq!(
                skip_reason(needs, &claimed).as_deref(),
                want,
                "{needs:?} of {claimed:?}"
            );
        }
    }

    #[test]
    fn capabilities_are_named_on_the_command_line_by_their_names() {
        for capability in Capability::ALL {
            assert_eq!(capability.name().parse(), Ok(capability));
        }
        let err = "deletions".parse::<Capability>().unwrap_err();
        assert_eq!(
            err,
            "no capability \"deletions\"; capabilities: authoritative, deletes, delta-updates, strict-exists, dry-run"
        );
    }
}
