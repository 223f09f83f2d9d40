dmesg | grep -i "started at EL"; dmesg | grep -E "ACPI: (RSDP|XSDT)"; cat /sys/firmware/efi/systab 2>&1; ls /sys/firmware/acpi/tables
for t in APIC GTDT SPCR MCFG IORT FACP DSDT; do echo "@@TABLE $t"; base64 /sys/firmware/acpi/tables/$t; echo "@@END $t"; done
r=$(grep ACPI20 /sys/firmware/efi/systab | cut -d= -f2); echo "rsdp=$r"; echo "@@TABLE RSDP"; dd if=/dev/mem bs=1 skip=$((r)) count=36 2>/dev/null | base64; echo "@@END RSDP"
