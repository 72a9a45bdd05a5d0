//! A worker binary with no task linked (its task crate dropped by the linker because nothing
//! names it) refuses to start and says why, instead of serving nothing in silence.

use std::sync::Arc;

use ferriq::memory::{MemoryBroker, MemoryStore};
use ferriq::worker::BuildError;
use ferriq::Worker;

#[test]
fn a_worker_with_no_task_linked_is_a_build_error_that_names_the_fix() {
    let err = Worker::builder()
        .broker(Arc::new(MemoryBroker::new()))
        .store(Arc::new(MemoryStore::new()))
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::NoTasks(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("no #[ferriq::task] is linked"), "{text}");
    assert!(text.contains("use your_tasks_crate as _;"), "{text}");
}
