#[ferriq::task(name = "ui.dup", max_attempts = 3, max_attempts = 4)]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

fn main() {}
