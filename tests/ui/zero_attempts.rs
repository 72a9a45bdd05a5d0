#[ferriq::task(name = "ui.zero", max_attempts = 0)]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

fn main() {}
