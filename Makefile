# The README's two commands: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := demo
# Take the CPU build of torch that lies on this machine's disk first; a looser requirement
# resolved by pip would pull a multi-GB CUDA build.
TORCH  := torch==2.13.0
# setuptools prints an information block (not a deprecation) on every editable install of a flat
# layout, asking to mind folders named like the package; the install itself is clean.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"
AZURITE := azurite@3.35.0

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(QUIET_EDITABLE) $(BIN)/python -m pip install -q -e '.[dev]'
	@# Azurite, the Azure Blob emulator the az:// tests run against (Node.js; without it they skip)
	if command -v npm >/dev/null; then npm install --prefix $(VENV)/azurite --no-audit --no-fund --loglevel=error $(AZURITE) \
	  || npm install --prefix $(VENV)/azurite --no-audit --no-fund --loglevel=error $(AZURITE) \
	  || echo "npm could not install $(AZURITE): the az:// tests will skip"; \
	  else echo "npm not found: the az:// tests will skip (Azurite needs Node.js)"; fi
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	rm -rf $(DEMO)
	$(BIN)/shardkit sample $(DEMO)/raw
	$(BIN)/shardkit build $(DEMO)/raw $(DEMO)/out --image-size 64 --resize-mode center-crop --encode raw --format both
	$(BIN)/shardkit inspect $(DEMO)/out
	$(BIN)/shardkit verify $(DEMO)/out
	$(BIN)/shardkit show $(DEMO)/out '#0'
	$(BIN)/python -m shardkit.demo $(DEMO)/out

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/build_bench.py

clean:
	rm -rf $(DEMO) .pytest_cache
