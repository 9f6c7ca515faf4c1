.PHONY: run serve test test-slow lint format install

## Install everything and run the whole system (web, Celery worker and beat, embedded Redis).
run: install
	.venv/bin/python scripts/run.py

## The portal on its production server (uvicorn, DEBUG off, worker and beat): DATABASE_URL
## (PostgreSQL) and REDIS_URL from the environment. See docs/deploy.md.
serve: install
	.venv/bin/gpu-portal-server serve

## Install what the tests need and run the suite, less the slowest live tests (marked `slow`).
test:
	bash scripts/test.sh -m "not slow"

## Only the tests marked `slow`: CI runs them after `make test`.
test-slow:
	bash scripts/test.sh -m slow

lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports

format: install
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

install:
	bash scripts/install.sh
