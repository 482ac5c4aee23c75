//! [`ProtocolKind`]: the one list of the protocols syncopate runs, with the names the
//! adapters spell them by and the knobs each takes. Every adapter's list of protocols (the
//! transport's protocol spec, the C constants, the command line's `--protocol`, the scenario
//! files, Python) is this list or an exhaustive `match` over it, so a protocol added here and
//! not wired into an adapter fails to compile or fails a test (docs/ADDING_A_PROTOCOL.md).

use core::fmt;

/// A protocol, without its settings ([`ProtocolConfig`](super::ProtocolConfig) is a protocol
/// with its settings; [`ProtocolConfig::kind`](super::ProtocolConfig::kind) relates the two).
///
/// WBSP's two variants are two kinds (`wbsp`, `wbsp-overlap`) over one configuration type,
/// because users pick them by name. Serialized as its name ([`Self::as_str`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProtocolKind {
    /// Bulk synchronous parallel.
    Bsp,
    /// Asynchronous parallel.
    Asp,
    /// Stale synchronous parallel.
    Ssp,
    /// Bounded asynchronous parallel.
    Bap,
    /// Static backup workers.
    Backup,
    /// Dynamic backup workers.
    Dbw,
    /// Worker-busy synchronous parallel, basic variant.
    Wbsp,
    /// Worker-busy synchronous parallel, uploads overlapped with local steps.
    WbspOverlap,
    /// BSP inside groups, asynchronous between the groups and a central server.
    Grouped,
}

/// A setting the adapters' protocol spec takes beyond the number of workers and the learning
/// rate (a command-line flag, a scenario-file key, a Python keyword, a field of the TCP run
/// settings). Each applies to some protocols only ([`ProtocolKind::takes`]); the adapters
/// refuse a knob set for a protocol that does not take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Knob {
    /// SSP's clock bound `s`, BAP's version bound `s_bap`.
    Staleness,
    /// BAP's per-iteration time limit.
    IterationTimeout,
    /// The static backup workers `b`.
    BackupWorkers,
    /// Whether stragglers abort or run to completion when an iteration closes.
    Interrupt,
    /// DBW's fewest gradients per update.
    KMin,
    /// The number of groups `G`.
    Groups,
    /// How a group's learning rate scales with its size.
    GroupLrScaling,
    /// WBSP's round deadline (close a round without a silent worker).
    RoundDeadline,
    /// Report a stall after this long without progress.
    StallReport,
}

impl Knob {
    /// Every knob, in the order the adapters check them.
    pub const ALL: [Self; 9] = [
        Self::Staleness,
        Self::IterationTimeout,
        Self::BackupWorkers,
        Self::Interrupt,
        Self::KMin,
        Self::Groups,
        Self::GroupLrScaling,
        Self::RoundDeadline,
        Self::StallReport,
    ];
}

impl ProtocolKind {
    /// Every protocol, in the order tables list them.
    pub const ALL: [Self; 9] = [
        Self::Bsp,
        Self::Asp,
        Self::Ssp,
        Self::Bap,
        Self::Backup,
        Self::Dbw,
        Self::Wbsp,
        Self::WbspOverlap,
        Self::Grouped,
    ];

    /// The names of [`Self::ALL`], in the same order.
    pub const NAMES: [&'static str; Self::ALL.len()] = {
        let mut names = [""; Self::ALL.len()];
        let mut i = 0;
        while i < names.len() {
            names[i] = Self::ALL[i].as_str();
            i += 1;
        }
        names
    };

    /// The name as the command line, scenario files, TCP run settings and Python spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Bsp => "bsp",
            Self::Asp => "asp",
            Self::Ssp => "ssp",
            Self::Bap => "bap",
            Self::Backup => "backup",
            Self::Dbw => "dbw",
            Self::Wbsp => "wbsp",
            Self::WbspOverlap => "wbsp-overlap",
            Self::Grouped => "grouped",
        }
    }

    /// The protocol named `name` (as [`Self::as_str`] spells it, exactly).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// What the protocol does, in one line (help texts list it beside the name).
    pub const fn summary(self) -> &'static str {
        match self {
            Self::Bsp => "Bulk synchronous parallel: wait for all n workers every step",
            Self::Asp => "Asynchronous parallel: apply every gradient on arrival",
            Self::Ssp => "Stale synchronous parallel: run ahead at most `staleness` clocks",
            Self::Bap => "Bounded asynchronous parallel: aggregate per iteration, run ahead on a cached model",
            Self::Backup => "Static backup workers: aggregate the fastest n − b gradients",
            Self::Dbw => "Dynamic backup workers: choose b every iteration",
            Self::Wbsp => "Worker-busy synchronous parallel",
            Self::WbspOverlap => "WBSP with communication overlapped with computation",
            Self::Grouped => "Groups synchronous inside, asynchronous to a central server",
        }
    }

    /// Whether the protocol takes `knob`.
    pub const fn takes(self, knob: Knob) -> bool {
        match knob {
            Knob::Staleness => matches!(self, Self::Ssp | Self::Bap),
            Knob::IterationTimeout => matches!(self, Self::Bap),
            Knob::BackupWorkers => matches!(self, Self::Backup),
            Knob::Interrupt => matches!(self, Self::Backup | Self::Dbw),
            Knob::KMin => matches!(self, Self::Dbw),
            Knob::Groups | Knob::GroupLrScaling => matches!(self, Self::Grouped),
            Knob::RoundDeadline => matches!(self, Self::Wbsp | Self::WbspOverlap),
            Knob::StallReport => !matches!(self, Self::Asp | Self::Wbsp | Self::WbspOverlap),
        }
    }

    /// The knobs the protocol takes, in [`Knob::ALL`]'s order.
    pub fn knobs(self) -> impl Iterator<Item = Knob> {
        Knob::ALL.into_iter().filter(move |&knob| self.takes(knob))
    }
}

impl fmt::Display for ProtocolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ProtocolKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ProtocolKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = ProtocolKind;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a protocol name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<ProtocolKind, E> {
                ProtocolKind::from_name(name).ok_or_else(|| E::unknown_variant(name, &ProtocolKind::NAMES))
            }
        }
        deserializer.deserialize_str(Name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_parse_back() {
        for (i, kind) in ProtocolKind::ALL.into_iter().enumerate() {
            assert_eq!(ProtocolKind::from_name(kind.as_str()), Some(kind));
            assert_eq!(ProtocolKind::NAMES[i], kind.as_str());
            assert_eq!(kind as usize, i, "ALL lists the variants in declaration order");
            assert!(!kind.summary().is_empty());
        }
        assert_eq!(ProtocolKind::from_name("BSP"), None);
        assert_eq!(ProtocolKind::from_name(""), None);
    }

    #[test]
    fn knobs_list_in_order() {
        for (i, knob) in Knob::ALL.into_iter().enumerate() {
            assert_eq!(knob as usize, i);
        }
        assert!(ProtocolKind::Asp.knobs().next().is_none());
        let dbw: std::vec::Vec<Knob> = ProtocolKind::Dbw.knobs().collect();
        assert_eq!(dbw, [Knob::Interrupt, Knob::KMin, Knob::StallReport]);
    }

    #[test]
    fn serde_spells_the_name() {
        let mut buf = [0u8; 32];
        for kind in ProtocolKind::ALL {
            let bytes = postcard::to_slice(&kind, &mut buf).unwrap();
            let back: ProtocolKind = postcard::from_bytes(bytes).unwrap();
            assert_eq!(back, kind);
        }
        let mut buf = [0u8; 32];
        let bytes = postcard::to_slice("nope", &mut buf).unwrap();
        assert!(postcard::from_bytes::<ProtocolKind>(bytes).is_err());
    }
}
