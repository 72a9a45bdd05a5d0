#[ferriq::task(name = "ui.cron", schedule = "every monday")]
async fn weekly() {}

fn main() {}
