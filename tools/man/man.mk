# tools/man/ — manual pages, installed under $(PREFIX)/share/man.
MANDIR ?= $(PREFIX)/share/man
MAN_PAGES := $(wildcard tools/man/*.[1-8])

.PHONY: install-man
install: install-man
install-man:
	@for p in $(MAN_PAGES); do \
		s=$${p##*.}; \
		install -d $(DESTDIR)$(MANDIR)/man$$s && \
		install -m 0644 $$p $(DESTDIR)$(MANDIR)/man$$s/ || exit 1; \
	done
