from paravt.cli import app

app()
