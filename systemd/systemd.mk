# systemd/ — kvd.service, kvd.socket, kvhttp.service, kvhttp.socket, sysusers and tmpfiles snippets, the default kvd.conf.
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d

.PHONY: install-systemd
install: install-systemd
install-systemd:
	install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) \
		$(DESTDIR)$(SYSCONFDIR)/kvd
	sed 's|/usr/bin/kvd|$(PREFIX)/bin/kvd|' systemd/kvd.service > $(DESTDIR)$(UNITDIR)/kvd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/kvd.service
	install -m 0644 systemd/kvd.socket $(DESTDIR)$(UNITDIR)/
	sed 's|/usr/bin/kvhttp|$(PREFIX)/bin/kvhttp|' systemd/kvhttp.service > $(DESTDIR)$(UNITDIR)/kvhttp.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/kvhttp.service
	install -m 0644 systemd/kvhttp.socket $(DESTDIR)$(UNITDIR)/
	install -m 0644 systemd/kvd.sysusers $(DESTDIR)$(SYSUSERSDIR)/kvd.conf
	install -m 0644 systemd/kvd.tmpfiles $(DESTDIR)$(TMPFILESDIR)/kvd.conf
	@# An administrator's edited kvd.conf is never overwritten.
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/kvd/kvd.conf ]; then \
		echo "keeping $(DESTDIR)$(SYSCONFDIR)/kvd/kvd.conf"; \
	else \
		echo "install -m 0644 systemd/kvd.conf $(DESTDIR)$(SYSCONFDIR)/kvd/kvd.conf"; \
		install -m 0644 systemd/kvd.conf $(DESTDIR)$(SYSCONFDIR)/kvd/kvd.conf; \
	fi
