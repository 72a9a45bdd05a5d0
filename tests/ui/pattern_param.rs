#[ferriq::task(name = "ui.pattern")]
async fn add((a, b): (i64, i64)) -> i64 {
    a + b
}

fn main() {}
