use std::any::TypeId;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use super::{AppState, State, TaskContext, TaskError, TaskOptions};
use crate::wire::{ArgumentBinder, ErrorKind, WireError};

/// The future of one run, as the registry stores it.
pub type RunFuture = Pin<Box<dyn Future<Output = Result<Value, TaskError>> + Send + 'static>>;

/// A task's entry in the registry, submitted through `inventory` by `#[task]`.
#[derive(Debug)]
pub struct TaskRegistration {
    pub(crate) name: &'static str,
    pub(crate) options: TaskOptions,
    pub(crate) run: fn(Invocation) -> RunFuture,
    pub(crate) states: &'static [StateRequirement],
    pub(crate) file: &'static str,
    pub(crate) line: u32,
    pub(crate) schedule: Option<StaticSchedule>,
}

inventory::collect!(TaskRegistration);

/// A schedule declared on a task with `#[task(schedule = …)]` or `#[task(every = …)]`.
#[derive(Debug, Clone, Copy)]
pub struct StaticSchedule {
    pub(crate) cron: Option<&'static str>,
    pub(crate) every: Option<u64>,
    pub(crate) timezone: Option<&'static str>,
    pub(crate) missed: &'static str,
    pub(crate) catch_up_max: u32,
    pub(crate) no_overlap: bool,
    pub(crate) args: &'static str,
}

impl StaticSchedule {
    /// Used by `#[task]`; not a stable API.
    #[doc(hidden)]
    pub const fn new(
        cron: Option<&'static str>,
        every: Option<u64>,
        timezone: Option<&'static str>,
        missed: &'static str,
        catch_up_max: u32,
        no_overlap: bool,
        args: &'static str,
    ) -> Self {
        StaticSchedule {
            cron,
            every,
            timezone,
            missed,
            catch_up_max,
            no_overlap,
            args,
        }
    }
}

impl TaskRegistration {
    /// Used by `#[task]`; not a stable API.
    #[doc(hidden)]
    pub const fn new(
        name: &'static str,
        options: TaskOptions,
        run: fn(Invocation) -> RunFuture,
        states: &'static [StateRequirement],
        file: &'static str,
        line: u32,
    ) -> Self {
        TaskRegistration {
            name,
            options,
            run,
            states,
            file,
            line,
            schedule: None,
        }
    }

    /// Used by `#[task]`; not a stable API.
    #[doc(hidden)]
    pub const fn with_schedule(mut self, schedule: StaticSchedule) -> Self {
        self.schedule = Some(schedule);
        self
    }

    /// The task's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The task's options.
    pub fn options(&self) -> &TaskOptions {
        &self.options
    }
    /// Where the task is defined (`file:line`).
    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// A type of app state a task needs.
#[derive(Debug, Clone, Copy)]
pub struct StateRequirement {
    type_id: fn() -> TypeId,
    type_name: fn() -> &'static str,
}

impl StateRequirement {
    /// The requirement for `State<T>`.
    pub const fn of<T: 'static>() -> Self {
        StateRequirement {
            type_id: TypeId::of::<T>,
            type_name: std::any::type_name::<T>,
        }
    }
    /// The type's id.
    pub fn type_id(&self) -> TypeId {
        (self.type_id)()
    }
    /// The type's name, for error messages.
    pub fn type_name(&self) -> &'static str {
        (self.type_name)()
    }
}

/// One run's inputs, handed to the generated run function.
#[derive(Debug)]
pub struct Invocation {
    context: TaskContext,
    args: Vec<Value>,
    kwargs: Map<String, Value>,
    state: Arc<AppState>,
}

impl Invocation {
    pub(crate) fn new(
        context: TaskContext,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
        state: Arc<AppState>,
    ) -> Self {
        Invocation {
            context,
            args,
            kwargs,
            state,
        }
    }

    /// Binds the arguments to `params` (the task's argument names, in order).
    pub fn bind(&mut self, params: &'static [&'static str]) -> Result<ArgumentBinder, TaskError> {
        ArgumentBinder::new(
            std::mem::take(&mut self.args),
            std::mem::take(&mut self.kwargs),
            params,
        )
        .map_err(TaskError::invalid_arguments)
    }

    /// The run's context.
    pub fn context(&self) -> TaskContext {
        self.context.clone()
    }

    /// App state of type `T`; the worker checked at start that it is registered.
    pub fn state<T: Send + Sync + 'static>(&self) -> Result<State<T>, TaskError> {
        self.state.get::<T>().ok_or_else(|| {
            TaskError::with_kind(
                ErrorKind::TaskError,
                format!(
                    "app state {} is not registered on the worker",
                    std::any::type_name::<T>()
                ),
                false,
            )
        })
    }
}

/// Serialises an argument for a message (generated code).
pub fn to_arg<T: Serialize + ?Sized>(value: &T) -> Result<Value, WireError> {
    serde_json::to_value(value).map_err(|e| WireError::Serialize(e.to_string()))
}

/// A plain return value as a run's output (generated code).
pub fn ok_output<T: Serialize>(value: T) -> Result<Value, TaskError> {
    serde_json::to_value(&value).map_err(|e| {
        TaskError::fatal(format!(
            "the task's return value cannot be written as JSON: {e}"
        ))
    })
}

/// A `Result` return value as a run's output (generated code).
pub fn result_output<T: Serialize, E: Into<TaskError>>(
    value: Result<T, E>,
) -> Result<Value, TaskError> {
    ok_output(value.map_err(Into::into)?)
}
