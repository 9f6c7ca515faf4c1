.PHONY: run serve test lint format install

## Install everything and run the whole system (web, Celery worker and beat, embedded Redis).
run: install
	.venv/bin/python scripts/run.py

## The portal on its production server (uvicorn, DEBUG off, worker and beat): DATABASE_URL
## (PostgreSQL) and REDIS_URL from the environment. See docs/deploy.md.
serve: install
	.venv/bin/gpu-portal-server serve

## Install what the tests need and run the whole suite.
test:
	bash scripts/test.sh

lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports

format: install
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

install:
	bash scripts/install.sh
