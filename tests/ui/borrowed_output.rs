#[ferriq::task(name = "ui.borrowed_output")]
async fn greet() -> &'static str {
    "hello"
}

fn main() {}
