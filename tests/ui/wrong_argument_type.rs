#[ferriq::task(name = "ui.typed")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

async fn enqueue(client: &ferriq::Client) {
    // The enqueue function is typed: a string where an i64 is expected does not compile.
    let _ = add::kiq(client, "one", 2).await;
}

fn main() {}
