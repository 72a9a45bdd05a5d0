//! `FERRIQ_*` settings, as the backends read them from the environment: a misspelt name is
//! pointed out, and `Debug` never shows a secret.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use crate::SecretUrl;

/// `FERRIQ_*` settings by name. `Debug` shows URLs redacted and hides values whose names say
/// they are secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Settings(BTreeMap<String, String>);

/// Every setting name asked for in this process, set or not: the names the linked backends
/// know, so that a set name nothing asks for (a misspelling) can be pointed out.
static ASKED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

impl Settings {
    /// A setting, when set and not empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        let mut asked = ASKED.lock().unwrap_or_else(|p| p.into_inner());
        if !asked.contains(name) {
            asked.insert(name.to_owned());
        }
        drop(asked);
        self.0.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
    }

    /// The `FERRIQ_*` names set here that neither `known` lists nor anything in this process
    /// has asked for (call it after connecting), each with the known or asked name it is
    /// likely a misspelling of. Names starting `FERRIQ_TEST_` are not reported.
    pub fn unread(&self, known: &[&str]) -> Vec<(String, Option<String>)> {
        let asked = ASKED.lock().unwrap_or_else(|p| p.into_inner());
        let read = |name: &str| known.contains(&name) || asked.contains(name);
        self.0
            .keys()
            .filter(|k| k.starts_with("FERRIQ_") && !k.starts_with("FERRIQ_TEST_") && !read(k))
            .map(|k| {
                let nearest = known
                    .iter()
                    .copied()
                    .chain(asked.iter().map(String::as_str))
                    .map(|n| (edit_distance(k, n), n))
                    .min()
                    .filter(|(d, _)| *d <= 3)
                    .map(|(_, n)| n.to_owned());
                (k.clone(), nearest)
            })
            .collect()
    }

    /// Logs a warning for each name [`Settings::unread`] reports, naming the setting it likely
    /// meant, once per name in this process (a client and a worker built from one environment
    /// say it once). `who` is what did not read it ("this worker", "this client").
    pub fn warn_unread(&self, who: &str, known: &[&str]) {
        static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
        for (name, nearest) in self.unread(known) {
            let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
            if !warned.insert(name.clone()) {
                continue;
            }
            drop(warned);
            match nearest {
                Some(meant) => tracing::warn!(
                    "{name} is set but nothing in {who} reads it: did you mean {meant}?"
                ),
                None => tracing::warn!("{name} is set but nothing in {who} reads it"),
            }
        }
    }

    /// Sets one.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.insert(name.into(), value.into());
    }
}

/// Levenshtein distance, for suggesting the setting a misspelt name meant.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(above + 1)
                .min(row[j] + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

impl<K: Into<String>, V: Into<String>> Extend<(K, V)> for Settings {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        self.0
            .extend(iter.into_iter().map(|(k, v)| (k.into(), v.into())));
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut map = f.debug_map();
        for (k, v) in &self.0 {
            let upper = k.to_ascii_uppercase();
            if upper.ends_with("_URL") {
                map.entry(k, &SecretUrl::new(v.clone()).redacted());
            } else if ["SECRET", "PASSWORD", "TOKEN", "KEY"]
                .iter()
                .any(|s| upper.contains(s))
            {
                map.entry(k, &"***");
            } else {
                map.entry(k, v);
            }
        }
        map.finish()
    }
}
