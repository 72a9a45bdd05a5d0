//! The registry: the allow-list of task names a worker runs (design §1.5, §4).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use thiserror::Error;

use crate::task::{AppState, TaskRegistration};

/// Why a registry could not be built.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two tasks registered the same name.
    #[error("task name {name:?} is registered twice: at {first} and at {second}; give one of them another `name = \"…\"`")]
    DuplicateName {
        /// The name.
        name: String,
        /// The first definition (`file:line`).
        first: String,
        /// The second definition (`file:line`).
        second: String,
    },
    /// A name asked for is not registered.
    #[error("task {0:?} is not registered in this binary; check the name or link the crate that defines it")]
    NotRegistered(String),
    /// A task needs app state the worker does not have.
    #[error("task {task:?} (at {location}) takes State<{type_name}> but no such state was registered on the worker; call WorkerBuilder::state")]
    MissingState {
        /// The task.
        task: String,
        /// Where the task is defined.
        location: String,
        /// The missing state's type.
        type_name: &'static str,
    },
}

/// The tasks a worker serves, by name. Only names in the registry run.
///
/// ```
/// #[ferriq::task(name = "docs.registry.ping")]
/// async fn ping() -> String { "pong".into() }
///
/// let registry = ferriq::Registry::from_inventory().unwrap().only(&["docs.registry.ping"]).unwrap();
/// assert_eq!(registry.names().collect::<Vec<_>>(), ["docs.registry.ping"]);
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    tasks: HashMap<&'static str, &'static TaskRegistration>,
}

impl Registry {
    /// Every task registered with `#[task]` in this binary; fails when two share a name,
    /// naming both definitions.
    pub fn from_inventory() -> Result<Self, RegistryError> {
        Self::from_registrations(inventory::iter::<TaskRegistration>)
    }

    /// A registry of the given registrations.
    pub fn from_registrations(
        registrations: impl IntoIterator<Item = &'static TaskRegistration>,
    ) -> Result<Self, RegistryError> {
        let mut tasks: HashMap<&'static str, &'static TaskRegistration> = HashMap::new();
        // Sorted by location so the error names the same pair in the same order every run.
        let mut all: Vec<_> = registrations.into_iter().collect();
        all.sort_by_key(|r| (r.file, r.line));
        for reg in all {
            if let Some(first) = tasks.insert(reg.name, reg) {
                return Err(RegistryError::DuplicateName {
                    name: reg.name.to_owned(),
                    first: first.location(),
                    second: reg.location(),
                });
            }
        }
        Ok(Registry { tasks })
    }

    /// Keeps only the named tasks (a lane); fails on a name that is not registered.
    pub fn only(mut self, names: &[&str]) -> Result<Self, RegistryError> {
        let mut kept = HashMap::new();
        for name in names {
            let (k, v) = self
                .tasks
                .remove_entry(*name)
                .ok_or_else(|| RegistryError::NotRegistered((*name).to_owned()))?;
            kept.insert(k, v);
        }
        self.tasks = kept;
        Ok(self)
    }

    /// Keeps only the tasks whose `queue` option is `queue` (tasks without one go to the default
    /// lane, `None`).
    pub fn lane(mut self, queue: Option<&str>) -> Self {
        self.tasks.retain(|_, r| r.options.get_queue() == queue);
        self
    }

    /// A task by name.
    pub fn get(&self, name: &str) -> Option<&'static TaskRegistration> {
        self.tasks.get(name).copied()
    }

    /// The names served, sorted.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        let sorted: BTreeMap<_, _> = self.tasks.iter().collect();
        sorted.into_keys().copied()
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether no task is served.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Checks that every task's app state is present.
    pub(crate) fn check_state(&self, state: &AppState) -> Result<(), RegistryError> {
        for reg in self.tasks.values() {
            for need in reg.states {
                if !state.contains(need.type_id()) {
                    return Err(RegistryError::MissingState {
                        task: reg.name.to_owned(),
                        location: reg.location(),
                        type_name: need.type_name(),
                    });
                }
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}
