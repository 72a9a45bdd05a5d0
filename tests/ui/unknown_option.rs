#[ferriq::task(name = "ui.unknown", retries = 3)]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

fn main() {}
