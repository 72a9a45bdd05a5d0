#[ferriq::task(name = "ui.not_async")]
fn add(a: i64, b: i64) -> i64 {
    a + b
}

fn main() {}
