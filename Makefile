# `make test` = scripts/test.sh (installs everything the tests need, then ruff + pytest).
# Extra pytest arguments: make test ARGS="-k vad -x"
.PHONY: test
test:
	scripts/test.sh $(ARGS)
