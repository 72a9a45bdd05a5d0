//! Two tasks with one name: the registry (and so the worker) refuses to start, naming both.

#[ferriq::task(name = "dup.same")]
async fn first() {}

mod elsewhere {
    #[ferriq::task(name = "dup.same")]
    pub async fn second() {}
}

#[test]
fn duplicate_names_fail_the_start_naming_both_places() {
    let err = ferriq::Registry::from_inventory().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("\"dup.same\""), "{text}");
    assert!(
        text.contains("tests/duplicate_names.rs:3"),
        "first place: {text}"
    );
    assert!(
        text.contains("tests/duplicate_names.rs:7"),
        "second place: {text}"
    );
    let env = ferriq::testing::TestEnv::new();
    assert!(
        env.worker().build().is_err(),
        "the default registry fails the worker's start"
    );
}
