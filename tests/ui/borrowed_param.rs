#[ferriq::task(name = "ui.borrowed")]
async fn greet(name: &str) -> String {
    format!("hello {name}")
}

fn main() {}
